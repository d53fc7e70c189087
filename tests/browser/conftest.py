"""Real-browser fixtures: a JupyterLab server, the system Chromium, and a driver for notebooks.

Fixtures (conventions.md §3.5, conventions 13 and 14):

- ``lab_server`` (session): ``python -m jupyter lab`` with ``jupyter_server_config.py`` beside this
  file, on 127.0.0.1 and a free port, serving a temporary root into which the repository's
  ``notebooks/`` directory is copied. Torn down with ``/api/shutdown``, then TERM → KILL of the
  server and every process it started (kernels and their children).
- ``chromium_browser`` (module): Playwright driving ``/usr/bin/chromium`` (never a downloaded one).
- ``lab`` (function) / ``lab_module`` (module): a :class:`JupyterLab` driver on a fresh page and
  workspace; teardown shuts down the kernels it started. A failed test that used one leaves
  ``test-artifacts/<test>-failure.png``; ``lab.screenshot(name)`` saves more on purpose.
- ``notebook_factory``: JSON text of a small notebook of code cells, for ``server.add_notebook``.

Every wait has a deadline and names what it waited for; nothing sleeps to synchronise.

Over 500 lines: the server, the browser and the notebook driver are one fixture stack that every
browser test uses.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import psutil
import pytest
from waits import wait_until

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS_DIR = REPO_ROOT / "test-artifacts"  # gitignored
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
SERVER_CONFIG = Path(__file__).with_name("jupyter_server_config.py")

# Flags for the system Chromium as root on a closed network (conventions.md §3.5).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]

# Deadlines are generous: the CI box and the shared dev box have 2 loaded cores. A healthy run
# finishes far inside them; they only bound how long a broken run hangs.
SERVER_START_S = 90.0
SERVER_STOP_S = 20.0
KERNEL_READY_S = 120.0
RUN_ALL_S = 120.0
RUN_CODE_S = 60.0

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def chromium_executable() -> str | None:
    """The system Chromium (Debian's ``chromium`` package), or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop_processes(procs: list[psutil.Process], grace_s: float) -> list[psutil.Process]:
    """TERM, wait ``grace_s``, KILL; return the processes that survived even that."""
    alive = [p for p in procs if p.is_running()]
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(alive, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    _, alive = psutil.wait_procs(alive, timeout=grace_s)
    return list(alive)


# ---------------------------------------------------------------------------------------------
# The JupyterLab server
# ---------------------------------------------------------------------------------------------


class LabServer:
    """A JupyterLab server for tests; ``start()`` / idempotent ``stop()``; see the module doc."""

    def __init__(self, root_dir: Path, state_dir: Path, log_path: Path) -> None:
        self.root_dir = root_dir
        self.state_dir = state_dir
        self.log_path = log_path
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._descendants: dict[int, psutil.Process] = {}

    def __repr__(self) -> str:
        state = "running" if self._proc and self._proc.poll() is None else "stopped"
        return f"<LabServer {self.url} root={self.root_dir} {state}>"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, attempts: int = 3) -> None:
        """Start the server and wait for ``/api/status``; retry on a port taken meanwhile."""
        for attempt in range(attempts):
            self.port = _free_port()
            self._spawn()
            try:
                wait_until(
                    self._status_or_exit,
                    timeout_s=SERVER_START_S,
                    what=f"JupyterLab /api/status on port {self.port}",
                    interval_s=0.2,
                )
            except TimeoutError as exc:
                self.stop()
                raise RuntimeError(f"{exc}; server log:\n{self.log_tail()}") from None
            if self._proc is not None and self._proc.poll() is None:
                return
            if attempt + 1 == attempts or "already in use" not in self.log_tail():
                raise RuntimeError(
                    f"JupyterLab exited with {self._proc and self._proc.returncode} before "
                    f"serving; log ({self.log_path}):\n{self.log_tail()}"
                )

    def _spawn(self) -> None:
        env = dict(os.environ)
        env.update(
            FREERIDE_LAB_TEST_PORT=str(self.port),
            FREERIDE_LAB_TEST_ROOT=str(self.root_dir),
            FREERIDE_LAB_TEST_STATE=str(self.state_dir),
            # Private Jupyter dirs: no user config, kernelspec or runtime file leaks in; the
            # venv's labextensions (widgets, anywidget) are still found under sys.prefix.
            JUPYTER_CONFIG_DIR=str(self.state_dir / "config"),
            JUPYTER_DATA_DIR=str(self.state_dir / "data"),
            JUPYTER_RUNTIME_DIR=str(self.state_dir / "runtime"),
            JUPYTERLAB_SETTINGS_DIR=str(self.state_dir / "user-settings"),
            JUPYTERLAB_WORKSPACES_DIR=str(self.state_dir / "workspaces"),
            JUPYTER_PLATFORM_DIRS="1",
            PYTHONPATH=os.pathsep.join(
                [str(REPO_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
            ),
            PYTHONUNBUFFERED="1",
        )
        log = self.log_path.open("ab")
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "jupyter", "lab", f"--config={SERVER_CONFIG}"],
                cwd=self.root_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        finally:
            log.close()

    def _status_or_exit(self) -> bool:
        if self._proc is None or self._proc.poll() is not None:
            return True  # exited: start() reports it
        try:
            self.api("GET", "/api/status", timeout_s=2)
        except (OSError, urllib.error.URLError):
            return False
        return True

    def api(self, method: str, path: str, *, timeout_s: float = 10) -> Any:
        """One REST call (no token: the test config has none); the decoded JSON or None."""
        request = urllib.request.Request(self.url + path, method=method)
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read()
        return json.loads(body) if body else None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def add_notebook(self, name: str, content: str | Path) -> str:
        """Write a notebook (JSON text or a file to copy) under the root; return its server path."""
        dest = self.root_dir / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copyfile(content, dest)
        else:
            dest.write_text(content, encoding="utf-8")
        return name

    def _remember_descendants(self) -> None:
        if self._proc is None:
            return
        try:
            for child in psutil.Process(self._proc.pid).children(recursive=True):
                self._descendants[child.pid] = child
        except psutil.NoSuchProcess:
            pass

    def shutdown_kernels(self) -> None:
        """Shut down every kernel (and so its process group) through the REST API."""
        self._remember_descendants()
        try:
            for session in self.api("GET", "/api/sessions") or []:
                self.api("DELETE", f"/api/sessions/{session['id']}", timeout_s=30)
            for kernel in self.api("GET", "/api/kernels") or []:
                self.api("DELETE", f"/api/kernels/{kernel['id']}", timeout_s=30)
        except (OSError, urllib.error.URLError):
            pass  # the server is gone; stop() reaps what is left

    def stop(self) -> None:
        """Shut the server down, then TERM → KILL it and everything it started. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        self._remember_descendants()
        if proc.poll() is None:
            try:
                self.api("POST", "/api/shutdown", timeout_s=5)
            except (OSError, urllib.error.URLError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=SERVER_STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=SERVER_STOP_S)
        leftovers = [p for p in self._descendants.values() if p.is_running()]
        survivors = _stop_processes(leftovers, grace_s=5)
        self._descendants.clear()
        if survivors:
            raise RuntimeError(f"processes survived KILL: {[p.pid for p in survivors]}")


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """A running JupyterLab serving a temp root that holds a copy of ``notebooks/``."""
    if chromium_executable() is None:
        pytest.skip("needs the system Chromium (apt-get install -y chromium)")
    pytest.importorskip("jupyterlab", reason="needs jupyterlab (pip install -e .[notebook])")
    base = tmp_path_factory.mktemp("jupyterlab")
    root = base / "root"
    root.mkdir()
    if NOTEBOOKS_DIR.is_dir():
        shutil.copytree(
            NOTEBOOKS_DIR,
            root / "notebooks",
            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "runs", "__pycache__"),
        )
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # one log per xdist worker
    log_name = f"jupyter-server-{worker}.log" if worker else "jupyter-server.log"
    server = LabServer(root, base / "state", ARTIFACTS_DIR / log_name)
    server.log_path.write_bytes(b"")
    server.start()
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------
# The browser
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium_browser() -> Iterator[Browser]:
    """Headless system Chromium under Playwright (module scope: other modules may start their own
    sync Playwright, and two cannot be live at once)."""
    executable = chromium_executable()
    if executable is None:
        pytest.skip("needs the system Chromium (apt-get install -y chromium)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="needs playwright (pip install -e .[browser])"
    )
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """On a failed test, save ``test-artifacts/<test>-failure.png`` of each page it drove.

    This runs before the test's fixtures are torn down, so the page is still open.
    """
    report = yield
    if report.when == "call" and report.failed:
        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, JupyterLab):
                try:
                    value.screenshot("failure", prefix=_slug(item.name))
                except Exception as exc:  # a dead page must not hide the test's own failure
                    report.sections.append(("failure screenshot", f"not saved: {exc}"))
    return report


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:120]


# ---------------------------------------------------------------------------------------------
# The notebook driver
# ---------------------------------------------------------------------------------------------

# [Note: driving JupyterLab] The test config sets ``expose_app_in_browser``, so
# ``window.jupyterapp`` is the JupyterFrontEnd: the current widget is the NotebookPanel, with
# ``context.path``, ``sessionContext`` (kernel and its status) and ``content.widgets`` (cells with
# models). Commands run through ``jupyterapp.commands.execute``. Long operations store their
# promise's outcome on ``window`` and the test polls it with a deadline, since ``page.evaluate``
# itself has none.

_JS_NOTEBOOK_STATE = """
(path) => {
  const app = window.jupyterapp;
  const dialog = document.querySelector('.jp-Dialog');
  const state = {app: !!app, dialog: dialog ? dialog.innerText.slice(0, 200) : null};
  const panel = app && app.shell && app.shell.currentWidget;
  if (!panel || !panel.context || !panel.sessionContext) return state;
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  const prompts = Array.from(panel.node.querySelectorAll('.jp-InputPrompt'));
  return Object.assign(state, {
    path: panel.context.path,
    ready: panel.context.isReady && panel.sessionContext.isReady,
    cells: panel.content ? panel.content.widgets.length : 0,
    kernel: kernel ? kernel.status : null,
    busy_prompts: prompts.filter((p) => p.textContent.includes('[*]')).length,
  });
}
"""

_JS_START_RUN_ALL = """
() => {
  const run = (window.__frlRunAll = {done: false, error: null});
  window.jupyterapp.commands.execute('notebook:run-all-cells').then(
    () => { run.done = true; },
    (e) => { run.done = true; run.error = String(e); });
}
"""

_JS_CELL_ERRORS = """
() => {
  const panel = window.jupyterapp.shell.currentWidget;
  const errors = [];
  panel.content.widgets.forEach((cell, index) => {
    if (cell.model.type !== 'code') return;
    for (const out of cell.model.outputs.toJSON()) {
      if (out.output_type === 'error') errors.push(`cell ${index}: ${out.ename}: ${out.evalue}`);
    }
  });
  return errors;
}
"""

_JS_CELL_OUTPUTS = """
() => {
  const panel = window.jupyterapp.shell.currentWidget;
  return Array.from(panel.node.querySelectorAll('.jp-Cell.jp-CodeCell')).map((cell) =>
    Array.from(cell.querySelectorAll('.jp-OutputArea-output')).map((o) => o.innerText).join('\\n'));
}
"""

_JS_RUN_CODE = """
async ({code, timeoutMs}) => {
  const panel = window.jupyterapp.shell.currentWidget;
  const kernel = panel.sessionContext.session.kernel;
  const chunks = [];
  let error = null;
  const future = kernel.requestExecute(
    {code, silent: false, store_history: false, allow_stdin: false, stop_on_error: false});
  future.onIOPub = (msg) => {
    const type = msg.header.msg_type;
    const content = msg.content;
    if (type === 'stream') chunks.push(content.text);
    else if ((type === 'execute_result' || type === 'display_data') && content.data
             && content.data['text/plain'] !== undefined)
      chunks.push(content.data['text/plain'] + '\\n');
    else if (type === 'error')
      error = `${content.ename}: ${content.evalue}\\n${(content.traceback || []).join('\\n')}`;
  };
  let timer;
  const timeout = new Promise((resolve) => {
    timer = setTimeout(() => resolve({timeout: true}), timeoutMs);
  });
  try {
    const reply = await Promise.race([future.done, timeout]);
    if (reply && reply.timeout) return {text: chunks.join(''), error, timeout: true};
  } catch (e) {
    error = error || String(e);
  } finally {
    clearTimeout(timer);
  }
  return {text: chunks.join(''), error, timeout: false};
}
"""

_JS_DISPATCH_DRAG = """
([source, target]) => {
  const data = new DataTransfer();
  const center = (el) => {
    const r = el.getBoundingClientRect();
    return {clientX: r.left + r.width / 2, clientY: r.top + r.height / 2};
  };
  const fire = (el, type, at) => el.dispatchEvent(new DragEvent(type, Object.assign(
    {bubbles: true, cancelable: true, composed: true, dataTransfer: data}, at)));
  fire(source, 'dragstart', center(source));
  fire(target, 'dragenter', center(target));
  fire(target, 'dragover', center(target));
  fire(target, 'drop', center(target));
  fire(source, 'dragend', center(target));
}
"""


@dataclass
class RunResult:
    """What a snippet run through the kernel printed, and its error (``ename: evalue``) if any."""

    text: str
    error: str | None


class JupyterLab:
    """Drives one JupyterLab page: open a notebook, run it, read it, drag things, screenshot."""

    wait_until = staticmethod(wait_until)  # for tests: conftest helpers are not importable

    def __init__(self, page: Page, server: LabServer, artifact_prefix: str) -> None:
        self.page = page
        self.server = server
        self.artifact_prefix = artifact_prefix
        self.path: str | None = None

    def __repr__(self) -> str:
        return f"<JupyterLab {self.server.url} notebook={self.path!r}>"

    # -- waiting ------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The current notebook panel's state (path, ready, kernel status, ``[*]`` prompts)."""
        return dict(self.page.evaluate(_JS_NOTEBOOK_STATE, self.path))

    def _wait_state(
        self, ok: Callable[[dict[str, Any]], bool], *, timeout_s: float, what: str
    ) -> dict[str, Any]:
        last: dict[str, Any] = {}

        def probe() -> dict[str, Any] | None:
            nonlocal last
            last = self.state()
            if last.get("dialog") and "Select Kernel" in last["dialog"]:
                self.page.locator(".jp-Dialog .jp-mod-accept").first.click()
            return last if ok(last) else None

        try:
            return wait_until(probe, timeout_s=timeout_s, what=what, interval_s=0.25)
        except TimeoutError as exc:
            shot = self._screenshot_quietly("timeout")
            raise TimeoutError(f"{exc}; last state {last}; screenshot {shot}") from None

    def _screenshot_quietly(self, name: str) -> Path | str:
        try:
            return self.screenshot(name)
        except Exception as exc:  # the page may be gone; the caller's error matters more
            return f"not saved ({exc})"

    def wait_kernel_idle(self, timeout_s: float = KERNEL_READY_S) -> None:
        """Wait until the notebook's kernel is idle and no cell shows ``[*]``."""
        self._wait_state(
            lambda s: s.get("kernel") == "idle" and s.get("busy_prompts") == 0,
            timeout_s=timeout_s,
            what=f"an idle kernel for {self.path}",
        )

    # -- notebook -------------------------------------------------------------------------------

    def open(self, path: str, timeout_s: float = KERNEL_READY_S) -> None:
        """Open ``path`` (relative to the server root) in a fresh workspace; wait for its kernel."""
        self.path = path
        workspace = f"frl-{uuid.uuid4().hex[:8]}"
        self.page.goto(
            f"{self.server.url}/lab/workspaces/{workspace}/tree/{quote(path)}",
            wait_until="domcontentloaded",
        )
        self._wait_state(
            lambda s: s.get("path") == path and bool(s.get("ready")) and s.get("cells", 0) > 0,
            timeout_s=timeout_s,
            what=f"notebook {path} open with a kernel session",
        )
        self.wait_kernel_idle(timeout_s)

    def run_all(self, timeout_s: float = RUN_ALL_S, *, allow_errors: bool = False) -> None:
        """Run all cells and wait until they finished and the kernel is idle.

        Raises:
            AssertionError: a cell produced an error output (unless ``allow_errors``).
        """
        self.page.evaluate(_JS_START_RUN_ALL)
        deadline = time.monotonic() + timeout_s
        self._wait_state(
            lambda s: bool(self.page.evaluate("() => window.__frlRunAll.done")),
            timeout_s=timeout_s,
            what=f"'run all cells' of {self.path} to finish",
        )
        self.wait_kernel_idle(max(1.0, deadline - time.monotonic()))
        failure = self.page.evaluate("() => window.__frlRunAll.error")
        errors = self.cell_errors()
        if (errors or failure) and not allow_errors:
            shot = self._screenshot_quietly("run-all-failed")
            raise AssertionError(
                f"running {self.path} failed: {failure or ''} {errors}; screenshot {shot}"
            )

    def cell_outputs(self) -> list[str]:
        """Each code cell's rendered output text, read from the DOM, in notebook order."""
        return list(self.page.evaluate(_JS_CELL_OUTPUTS))

    def cell_errors(self) -> list[str]:
        """``cell <i>: <ename>: <evalue>`` for each error output in the notebook."""
        return list(self.page.evaluate(_JS_CELL_ERRORS))

    def run_code(self, code: str, timeout_s: float = RUN_CODE_S) -> RunResult:
        """Run ``code`` in the open notebook's kernel (outside the notebook); return its output.

        Text is stdout/stderr plus the ``text/plain`` of results and displays. The kernel must be
        idle to start it, so a notebook whose cells return at once (convention 6) answers fast.
        """
        reply = self.page.evaluate(_JS_RUN_CODE, {"code": code, "timeoutMs": int(timeout_s * 1000)})
        if reply.get("timeout"):
            raise TimeoutError(f"waited {timeout_s:.0f} s for the kernel to run {code[:80]!r}")
        error = reply.get("error")
        return RunResult(
            text=_ANSI.sub("", reply.get("text") or ""),
            error=_ANSI.sub("", error) if error else None,
        )

    def wait_for_selector_count(
        self, selector: str, *, at_least: int = 1, timeout_s: float = RUN_ALL_S
    ) -> int:
        """Wait until ``selector`` matches at least ``at_least`` elements; return the count."""
        locator = self.page.locator(selector)
        return wait_until(
            lambda: (n := locator.count()) >= at_least and n,
            timeout_s=timeout_s,
            what=f"{at_least}+ elements matching {selector!r}",
            interval_s=0.25,
        )

    # -- drag and drop ----------------------------------------------------------------------------

    def drag(self, source: Locator, target: Locator, *, method: str = "mouse") -> None:
        """Drag ``source`` onto ``target``.

        ``method="mouse"`` moves the real mouse (Playwright turns it into native HTML5 drag and
        drop in Chromium, and pointer-event code sees it too); ``"events"`` dispatches
        dragstart/dragenter/dragover/drop/dragend with one shared ``DataTransfer``.
        """
        source.scroll_into_view_if_needed()
        if method == "mouse":
            source.drag_to(target)
        elif method == "events":
            self.page.evaluate(
                _JS_DISPATCH_DRAG, [source.element_handle(), target.element_handle()]
            )
        else:
            raise ValueError(f"method={method!r}; valid: 'mouse', 'events'")

    # -- artifacts ------------------------------------------------------------------------------

    def screenshot(self, name: str, *, prefix: str | None = None) -> Path:
        """Save a PNG of the page as ``test-artifacts/<prefix>-<name>.png``; return its path.

        ``prefix`` defaults to the test's (or, for ``lab_module``, the module's) name.
        """
        ARTIFACTS_DIR.mkdir(exist_ok=True)
        path = ARTIFACTS_DIR / f"{prefix or self.artifact_prefix}-{_slug(name)}.png"
        self.page.screenshot(path=str(path))
        return path


@contextlib.contextmanager
def _driver(browser: Browser, server: LabServer, prefix: str) -> Iterator[JupyterLab]:
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    try:
        yield JupyterLab(context.new_page(), server, prefix)
    finally:
        context.close()
        server.shutdown_kernels()


@pytest.fixture
def lab(
    lab_server: LabServer, chromium_browser: Browser, request: pytest.FixtureRequest
) -> Iterator[JupyterLab]:
    """A :class:`JupyterLab` driver on a fresh page; shuts down its kernels after the test."""
    with _driver(chromium_browser, lab_server, _slug(request.node.name)) as driver:
        yield driver


@pytest.fixture(scope="module")
def lab_module(
    lab_server: LabServer, chromium_browser: Browser, request: pytest.FixtureRequest
) -> Iterator[JupyterLab]:
    """Like ``lab``, shared by a module's tests (to run an expensive notebook once)."""
    with _driver(chromium_browser, lab_server, _slug(request.module.__name__)) as driver:
        yield driver


@pytest.fixture(scope="session")  # a pure function: module fixtures may use it too
def notebook_factory() -> Callable[[list[str]], str]:
    """Make a small notebook (JSON text) of code cells with a ``python3`` kernelspec."""
    nbformat = pytest.importorskip("nbformat")

    def make(sources: list[str]) -> str:
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {
            "name": "python3",
            "display_name": "Python 3",
            "language": "python",
        }
        nb.cells = [nbformat.v4.new_code_cell(src) for src in sources]
        return str(nbformat.writes(nb))

    return make
