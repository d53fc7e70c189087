"""A Session shows as its dashboard in a notebook because loading the extension registers the
view with IPython's display formatters (``freeride_lab.ui.display``); ``lab`` has no display
code of its own, and unloading removes the view."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("IPython")

from IPython.core.interactiveshell import InteractiveShell

from freeride_lab.core.config import RunConfig
from freeride_lab.io.rundir import RunDir
from freeride_lab.lab.session import Session
from freeride_lab.ui.dashboard import WIDGET_MIME, stop_all


@pytest.fixture
def shell() -> Iterator[InteractiveShell]:
    ip = InteractiveShell.instance()
    yield ip
    ip.run_line_magic("unload_ext", "freeride_lab")
    stop_all()


@pytest.fixture
def session(tmp_path: Path) -> Session:
    """A finished run with no events, opened from its files."""
    path = tmp_path / "run"
    rd = RunDir(path)
    rd.create()
    config = RunConfig(schedule="1F1B", stages=2, microbatches=2, steps=3, workload="synthetic")
    config = config.replace(run_dir=str(path), master_port=29500)
    rd.write_json(rd.run_json, {"run_id": "r1", "config": config.to_dict(), "owner_pid": 1})
    rd.write_json(rd.status_json, {"state": "finished", "reason": "every rank finished"})
    return Session.open(path)


def shown(ip: InteractiveShell, obj: Any) -> dict[str, Any]:
    data, _metadata = ip.display_formatter.format(obj)
    return data


def test_a_session_has_no_display_of_its_own(session: Session) -> None:
    assert not hasattr(session, "_repr_mimebundle_")


def test_loading_the_extension_shows_a_session_as_its_dashboard(shell, session) -> None:
    shell.run_line_magic("load_ext", "freeride_lab")
    data = shown(shell, session)
    assert WIDGET_MIME in data
    assert "r1" in data["text/html"] and data["text/plain"] == repr(session)


def test_unloading_the_extension_leaves_the_plain_repr(shell, session) -> None:
    shell.run_line_magic("load_ext", "freeride_lab")
    shell.run_line_magic("reload_ext", "freeride_lab")
    shell.run_line_magic("unload_ext", "freeride_lab")
    assert shown(shell, session) == {"text/plain": repr(session)}
    shell.run_line_magic("load_ext", "freeride_lab")  # the fixture unloads it again


def test_importing_freeride_lab_inside_ipython_registers_the_view_without_the_extension(
    tmp_path: Path,
) -> None:
    """A notebook that only does ``Session.launch(...)`` (no ``%load_ext``) sees the dashboard."""
    repo = Path(__file__).resolve().parents[2]
    source = (
        "import json\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "ip = InteractiveShell.instance()\n"
        "from freeride_lab.lab.session import Session\n"
        "printers = ip.display_formatter.mimebundle_formatter.deferred_printers\n"
        "print(json.dumps(('freeride_lab.lab.session', 'Session') in printers))\n"
    )
    path = os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", source],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        cwd=tmp_path,
        timeout=300,
        check=True,
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) is True
