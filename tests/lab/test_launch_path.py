"""What a notebook's launch cell costs and shows: launching loads neither torch nor pandas in
the kernel (torch loads in the ranks, pandas at the first table read), ``Session.progress``
names the phase a dashboard shows, and ``Session.report`` reaches the report through a hook,
so a headless lab without the report's packages says which extra to install.

The launch tests start real runs (torchrun, gloo, sleep-timed ranks); their waits are for named
conditions with generous deadlines, never fixed sleeps, and no test here times anything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from runs import synthetic_config
from waits import wait_until

from freeride_lab.core.config import RunConfig
from freeride_lab.io.rundir import RunDir
from freeride_lab.lab import hooks
from freeride_lab.lab.session import Session

REPO = Path(__file__).resolve().parents[2]
STARTUP_S = 240.0  # first step of a fresh run on a loaded box (a torch import per process)
QUICKSTART = "schedule='1F1B', stages=4, microbatches=4, steps=1000, workload='synthetic'"


def run_python(source: str, cwd: Path) -> dict[str, object]:
    """Run ``source`` in a fresh interpreter (a new kernel) and return the JSON it prints last."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- what the launch path loads ------------------------------------------------------------------


def test_importing_the_lab_and_building_the_quickstart_config_loads_no_torch_or_pandas(
    tmp_path: Path,
) -> None:
    loaded = run_python(
        f"""
        import json, sys
        import freeride_lab.lab
        from freeride_lab.lab import Session
        from freeride_lab.core.config import RunConfig
        RunConfig({QUICKSTART})
        print(json.dumps({{"loaded": [m for m in ("torch", "pandas") if m in sys.modules]}}))
        """,
        tmp_path,
    )
    assert loaded == {"loaded": []}


def test_launching_the_quickstart_run_loads_no_torch_or_pandas_in_the_kernel(
    tmp_path: Path,
) -> None:
    """The launch cell returns before anything heavy is imported here; the ranks import torch
    in their own processes, and the first table read loads pandas."""
    result = run_python(
        f"""
        import json, sys
        from freeride_lab.core.config import RunConfig
        from freeride_lab.lab import Session
        session = Session.launch(RunConfig({QUICKSTART}), run_dir="run", grace_s=5)
        at_launch = [m for m in ("torch", "pandas") if m in sys.modules]
        progress = session.progress
        session.stop()
        print(json.dumps({{"at_launch": at_launch, "progress": progress,
                           "state": str(session.state)}}))
        """,
        tmp_path,
    )
    assert result["at_launch"] == []
    assert result["progress"] == "starting 4 ranks…"
    assert result["state"] == "stopped"


# -- progress ------------------------------------------------------------------------------------


def tiny(steps: int) -> RunConfig:
    return synthetic_config(steps=steps, microbatches=2, phase_ms=5.0)


def test_progress_goes_from_starting_through_steps_to_stopped(tmp_path: Path) -> None:
    seen: list[str] = []

    def note() -> str:
        phase = session.progress
        if not seen or seen[-1] != phase:
            seen.append(phase)
        return phase

    def step_shown() -> int:
        """The step the progress line shows now (-1 before the first)."""
        phase = note()
        return int(phase.split(" ")[1].split("/")[0]) if phase.startswith("step ") else -1

    with Session.launch(tiny(steps=1000), run_dir=tmp_path / "run", grace_s=5) as session:
        assert note() == "starting 2 ranks…"
        wait_until(lambda: step_shown() >= 0, timeout_s=STARTUP_S, what="a step")
        # the line itself must have shown step 2 (steps_done may run ahead of the last read)
        wait_until(lambda: step_shown() >= 2, timeout_s=60, what="2 steps")
        session.stop()
        assert note().startswith("stopped at step ") and note().endswith("/1000")
    kinds = [p.split(" ")[0].rstrip("…:") for p in seen]
    order = ["starting", "calibrating", "step", "stopped"]
    assert kinds == sorted(kinds, key=order.index), seen  # never back to an earlier phase
    assert {"starting", "step", "stopped"} <= set(kinds), seen
    steps = [int(p.split(" ")[1].split("/")[0]) for p in seen if p.startswith("step ")]
    assert steps == sorted(steps) and steps[-1] >= 2, seen


def test_progress_of_a_finished_run_counts_its_steps_also_when_reopened(tmp_path: Path) -> None:
    with Session.launch(tiny(steps=3), run_dir=tmp_path / "run", grace_s=5) as session:
        assert session.wait(timeout_s=STARTUP_S) == "finished"
        assert session.progress == "finished: 3/3 steps"
    assert Session.open(tmp_path / "run").progress == "finished: 3/3 steps"


# -- the report hook -----------------------------------------------------------------------------


def finished_run_dir(path: Path) -> Path:
    """A run directory of a finished run with no events: enough for ``Session.open``."""
    rd = RunDir(path)
    rd.create()
    config = tiny(steps=3).replace(run_dir=str(path), master_port=29500)
    rd.write_json(rd.run_json, {"run_id": "r1", "config": config.to_dict(), "owner_pid": 1})
    rd.write_json(rd.status_json, {"state": "finished", "reason": "every rank finished"})
    return path


def test_report_without_a_registered_writer_names_the_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hooks, "_report_writer", None)
    session = Session.open(finished_run_dir(tmp_path / "run"))
    with pytest.raises(ImportError, match=r"pip install 'freeride-lab\[ui\]'"):
        session.report(tmp_path / "report.html")
    assert not (tmp_path / "report.html").exists()


def test_report_without_the_report_packages_is_one_import_error_naming_the_extra(
    tmp_path: Path,
) -> None:
    """The report's packages are missing (here: jinja2 cannot be imported)."""
    finished_run_dir(tmp_path / "run")
    result = run_python(
        """
        import json, sys
        class NoJinja:
            def find_spec(self, name, path=None, target=None):
                if name == "jinja2" or name.startswith("jinja2."):
                    raise ModuleNotFoundError("No module named 'jinja2'", name="jinja2")
                return None
        sys.meta_path.insert(0, NoJinja())
        from freeride_lab.lab import Session
        try:
            Session.open("run").report("report.html")
        except ImportError as e:
            print(json.dumps({"error": type(e).__name__, "message": str(e)}))
        """,
        tmp_path,
    )
    assert result["error"] == "ImportError"
    message = str(result["message"])
    assert "jinja2 is missing" in message and "pip install 'freeride-lab[ui]'" in message
    assert not (tmp_path / "report.html").exists()


def test_a_report_writer_must_be_callable() -> None:
    with pytest.raises(TypeError, match="must be callable"):
        hooks.set_report_writer("freeride_lab.ui.report")  # type: ignore[arg-type]
