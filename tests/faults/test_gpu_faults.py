"""GPU faults (marker ``gpu``; skipped on a machine without CUDA or MPS): a CUDA
training rank served by the run's private MPS daemon is killed with SIGKILL. Within 10 s the
session names the rank and the signal, the MPS daemon (control and server) is gone and no
process of the run is left. Processes are found by walking the process table, not through our
own bookkeeping. See ``lab.session`` [Note: MPS daemon].
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from runs import synthetic_config
from waits import run_processes, wait_until

from freeride_lab.core.runtime_options import RuntimeOptions
from freeride_lab.lab.session import Session
from freeride_lab.pipeline.launcher import RunState

pytestmark = pytest.mark.gpu

STARTUP_S = 240.0  # CUDA init under MPS plus torchrun on a busy box
REPORTED_S = 10.0  # the promise: failing rank reported and everything reaped within this
CONFIG = synthetic_config(  # one CUDA rank on one GPU
    steps=100_000,
    stages=1,
    phase_ms=10.0,
    device="cuda",
    mps=True,
    seed=3,
    runtime=RuntimeOptions(),
)
MPS_NAMES = ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")


def mps_processes() -> set[int]:
    """Pids of every MPS control daemon and server on this machine."""
    found = set()
    for p in psutil.process_iter(["name", "status"]):
        if p.info["name"] in MPS_NAMES and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.add(p.pid)
    return found


def alive(pids: set[int]) -> set[int]:
    left = set()
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.add(pid)
    return left


@pytest.fixture
def cuda_run(tmp_path: Path) -> Iterator[tuple[Session, set[int]]]:
    """A CUDA run under its own MPS daemon, two steps in; with the pids of that daemon."""
    from freeride_lab.gpu.mps import MpsDaemon

    available = MpsDaemon.available()
    if not available:
        pytest.skip(f"MPS unavailable: {available.reason}")
    before = mps_processes()
    run = Session.launch(CONFIG, run_dir=tmp_path / "run", grace_s=5)
    try:
        wait_until(
            lambda: run.steps_done >= 2 or run.state.done,
            timeout_s=STARTUP_S,
            what="two CUDA steps",
        )
        assert not run.state.done, f"the run ended before the test: {run.failure}"
        yield run, mps_processes() - before
    finally:
        run.stop()


def test_a_killed_cuda_rank_is_reported_and_its_mps_daemon_and_processes_are_gone_in_10_s(
    cuda_run: tuple[Session, set[int]],
) -> None:
    from freeride_lab.gpu.mps import MpsDaemon

    run, daemon_pids = cuda_run
    entry = run.run_dir.read_run()["mps"]
    daemon = MpsDaemon(entry["pipe_dir"], entry["log_dir"])
    assert entry["active"] and daemon.is_running() and daemon_pids, entry
    (rank_0,) = [
        p
        for p in run_processes(run.run_dir.path, environ=True)
        if "freeride_lab.pipeline.rank" in p.cmdline() and p.environ().get("RANK") == "0"
    ]

    rank_0.kill()
    deadline = time.monotonic() + REPORTED_S
    wait_until(lambda: run.state.done, timeout_s=REPORTED_S, what="the session to see the run end")
    assert run.state == RunState.FAILED
    failure = run.failure
    assert failure is not None and failure.rank == 0, failure
    assert "SIGKILL" in failure.reason, failure.reason
    left = max(0.0, deadline - time.monotonic())
    wait_until(
        lambda: not alive(daemon_pids),
        timeout_s=left,
        what=f"MPS daemon pids {daemon_pids} to exit",
    )
    assert not daemon.is_running()
    wait_until(
        lambda: not run_processes(run.run_dir.path, environ=True),
        timeout_s=max(0.0, deadline - time.monotonic()),
        what="every process of the run to exit",
    )
