"""Every notebook in ``notebooks/`` runs headless, at small sizes, and leaves no process behind.

Each notebook is copied into a fresh directory (the kernel's working directory, so runs, reports
and ``.freeride_tasks`` land there) and executed cell by cell with nbclient on a ``python3``
kernel whose spec points at this interpreter. Cells with ``nbmake.mock`` metadata get the same
treatment nbmake gives them: the mocked globals are set right after the cell runs (CI sizes).
A notebook may end with a "when you are done" cell (``WHEN_DONE``): commented out, so that Run
All leaves its run training for the user to play with. The test records what is running after
Run All, then runs that cell uncommented, as a user does when done. Before the kernel shuts down,
the test checks that the notebook itself stopped every process it started (none may be left
under the kernel, nor name the notebook's directory).

``pytest --nbmake notebooks/`` runs the same notebooks without these extra checks.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

pytestmark = [pytest.mark.notebook, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
CELL_TIMEOUT_S = 600  # one cell; the slowest waits for runs on a loaded two-core box
STARTUP_S = 120
WHEN_DONE = "# %freeride stop"  # a last cell that Run All passes over; run uncommented when done


@dataclass
class Executed:
    """A notebook after execution: its cells (then its when-done cells, uncommented), the
    directory it ran in, the processes running after Run All, and the processes it left."""

    nb: Any
    workdir: Path
    after_run_all: list[str]
    leftovers: list[str]

    def text(self, index: int | None = None) -> str:
        """Text of all outputs (stream text and text/plain), of one cell or of every cell."""
        cells = self.nb.cells if index is None else [self.nb.cells[index]]
        out: list[str] = []
        for cell in cells:
            for output in cell.get("outputs", []):
                if output.get("output_type") == "stream":
                    out.append(output.get("text", ""))
                elif "data" in output:
                    out.append(str(output["data"].get("text/plain", "")))
        return "\n".join(out)

    def widget_views(self) -> int:
        """How many widget views the outputs display."""
        return sum(
            "application/vnd.jupyter.widget-view+json" in output.get("data", {})
            for cell in self.nb.cells
            for output in cell.get("outputs", [])
        )


@pytest.fixture(scope="module")
def python3_kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A ``python3`` kernelspec for this interpreter, first on JUPYTER_PATH for the module."""
    root = tmp_path_factory.mktemp("jupyter")
    spec_dir = root / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (freeride_lab tests)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JUPYTER_PATH", os.pathsep.join([str(root), os.environ.get("JUPYTER_PATH", "")]))
        yield "python3"


def with_mocks(nb: Any) -> Any:
    """Insert, after each cell with ``nbmake.mock`` metadata, a cell setting those globals."""
    cells = []
    for cell in nb.cells:
        cells.append(cell)
        mock = cell.get("metadata", {}).get("nbmake", {}).get("mock")
        if cell.cell_type == "code" and mock:
            source = "\n".join(f"{name} = {value!r}" for name, value in mock.items())
            cells.append(nbformat.v4.new_code_cell(source))
    nb.cells = cells
    return nb


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _naming(workdir: Path) -> list[psutil.Process]:
    needle = str(workdir)
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if any(needle in arg for arg in cmdline) and proc.pid != os.getpid():
            found.append(proc)
    return found


def _running(workdir: Path, kernel_pid: int | None) -> list[str]:
    """Live processes under the kernel or naming the notebook's directory: "pid cmdline"."""
    procs = {p.pid: p for p in _naming(workdir)}
    if kernel_pid is not None:
        procs.update({p.pid: p for p in _descendants(kernel_pid)})
    running = []
    for proc in procs.values():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                running.append(f"{proc.pid} {' '.join(proc.cmdline())[:160]}")
        except psutil.NoSuchProcess:
            pass
    return running


def execute(name: str, tmp_path: Path, kernel_name: str) -> Executed:
    """Run ``notebooks/<name>`` in ``tmp_path``; record processes left before the kernel ends."""
    workdir = tmp_path / "nb"
    workdir.mkdir()
    shutil.copyfile(NOTEBOOKS / name, workdir / name)
    nb = with_mocks(nbformat.read(workdir / name, as_version=4))
    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        startup_timeout=STARTUP_S,
        kernel_name=kernel_name,
        resources={"metadata": {"path": str(workdir)}},
    )
    with client.setup_kernel():
        for index, cell in enumerate(list(nb.cells)):
            client.execute_cell(cell, index)
        kernel_pid = client.km.provisioner.pid if client.km.provisioner else None
        after_run_all = _running(workdir, kernel_pid)
        for cell in [c for c in nb.cells if c.cell_type == "code" and c.source == WHEN_DONE]:
            nb.cells.append(nbformat.v4.new_code_cell(cell.source.removeprefix("# ")))
            client.execute_cell(nb.cells[-1], len(nb.cells) - 1)
        leftovers = _running(workdir, kernel_pid)
    nbformat.write(nb, workdir / f"executed-{name}")  # kept for a look after a failure
    return Executed(nb, workdir, after_run_all, leftovers)


def test_every_notebook_is_tested_here():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(CHECKS)


def test_notebooks_are_stored_without_outputs():
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        stale = [
            i
            for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))
        ]
        assert not stale, f"{path.name}: cells {stale} carry outputs; strip them"
        assert nb.metadata["kernelspec"]["name"] == "python3", path.name


def check_quickstart(run: Executed) -> None:
    text = run.text()
    assert "launched run" in text
    assert "attached pagerank" in text
    assert run.widget_views() >= 1  # the dashboard
    assert (run.workdir / "report" / "quickstart.html").is_file()
    assert any("freeride_lab.pipeline.rank" in p for p in run.after_run_all), (
        "Run All must leave the run training"
    )
    assert "stopped after" in run.text(len(run.nb.cells) - 1)  # the when-done cell


def check_custom_side_task(run: Executed) -> None:
    text = run.text()
    assert "side task 'montecarlo'" in text
    assert (run.workdir / ".freeride_tasks" / "montecarlo.py").is_file()
    assert "attached" in text and "tuned" in text and "detached" in text


def check_schedules(run: Executed) -> None:
    text = run.text()
    for schedule in ("GPipe", "1F1B", "Interleaved1F1B"):
        assert schedule in text
    assert "measured_frac" in text and "planner_frac" in text and "theory_frac" in text


def check_report(run: Executed) -> None:
    reports = list((run.workdir / "report").glob("*.html"))
    assert reports, "04-report wrote no report"
    assert (reports[0].parent / "actions.parquet").is_file()
    assert "finished" in run.text()


CHECKS = {
    "01-quickstart.ipynb": check_quickstart,
    "02-custom-side-task.ipynb": check_custom_side_task,
    "03-schedules.ipynb": check_schedules,
    "04-report.ipynb": check_report,
}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_notebook_runs_and_stops_what_it_started(
    name: str, tmp_path: Path, python3_kernel: str
) -> None:
    if not (NOTEBOOKS / name).is_file():
        pytest.fail(f"notebooks/{name} is missing")
    run = execute(name, tmp_path, python3_kernel)
    CHECKS[name](run)
    assert not run.leftovers, f"{name} left processes running: {run.leftovers}"
