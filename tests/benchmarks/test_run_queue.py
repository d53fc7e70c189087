"""The run-queue sampler: a command's process tree, what each process ran and waited."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from bench_scripts import load_script

# a parent that starts two children which each spin for a while, then exits with status 3
_TREE = textwrap.dedent(
    """
    import subprocess, sys
    spin = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.6: pass"
    children = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    for c in children:
        c.wait()
    sys.exit(3)
    """
)


def test_every_process_of_the_tree_is_recorded_and_the_commands_status_is_kept(
    tmp_path: Path,
) -> None:
    rq = load_script("run_queue")
    out = tmp_path / "rq.json"
    rc = rq.main(["--out", str(out), "--interval-s", "0.05", "--", sys.executable, "-c", _TREE])
    assert rc == 3
    record = json.loads(out.read_text())
    assert record["returncode"] == 3
    procs = record["processes"]
    assert len(procs) == 3  # the parent and its two children
    spinners = [p for p in procs if p["cpu_s"] >= 0.3]
    assert len(spinners) == 2  # each child's spin is counted to it, not to its parent
    roles = record["roles"]
    assert sum(r["processes"] for r in roles.values()) == 3
    assert sum(r["cpu_s"] for r in roles.values()) >= 1.0
    cpu = record["cpu"]
    assert 0 < cpu["busy_frac"] <= 1 and 0 <= cpu["steal_frac"] <= 1


def test_roles_come_from_the_module_a_process_runs() -> None:
    rq = load_script("run_queue")
    assert rq.role_of(["python3", "-m", "freeride_lab.pipeline.rank", "--rank", "2"]) == (
        "pipeline rank"
    )
    assert rq.role_of(["python3", "-m", "freeride_lab.sidetasks.worker"]) == "side-task worker"
    assert rq.role_of(["python3", "-m", "freeride_lab.cli", "bench"]) == "bench"
    assert rq.role_of([]) == "?"


@pytest.mark.parametrize("text", ["", "garbage", "1 2", "0 0 0\n"])
def test_a_schedstat_that_says_nothing_reads_as_absent_not_as_zero(
    tmp_path: Path, text: str
) -> None:
    rq = load_script("run_queue")
    path = tmp_path / "schedstat"
    path.write_text(text)
    assert rq.read_schedstat(path) is None
    assert rq.read_schedstat(tmp_path / "missing") is None
    path.write_text("2000 500 7\n")
    assert rq.read_schedstat(path) == (2000, 500, 7)


def test_a_command_is_required_and_one_that_cannot_run_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rq = load_script("run_queue")
    out = tmp_path / "x.json"
    with pytest.raises(SystemExit):
        rq.main(["--out", str(out)])
    with pytest.raises(SystemExit):
        rq.main(["--out", str(out), "--", str(tmp_path / "no-such-program")])
    assert "cannot run" in capsys.readouterr().err and not out.exists()
