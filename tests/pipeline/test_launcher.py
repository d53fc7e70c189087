"""Claims about the launcher's pure parts: run states, the torchrun command, failure reasons.

Its process behaviour (watchdog, stop, SIGINT) is tested through ``Session`` with real runs in
``tests/lab/test_session.py``.
"""

from __future__ import annotations

import json

import pytest

from freeride_lab.io.rundir import RunDir
from freeride_lab.pipeline.launcher import (
    EXIT_CODES,
    Rendezvous,
    RunState,
    advance,
    failure_reason,
    state_of_exit_code,
    torchrun_command,
)

FAILURE = """[{idx}]:
  time      : 2026-01-01_12:00:00
  host      : localhost
  rank      : {rank} (local_rank: {rank})
  exitcode  : {code} (pid: 4242)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"""


def torchrun_log(root: tuple[int, int], *others: tuple[int, int]) -> str:
    """torchrun's ChildFailedError report: other failures first, then the root cause."""
    rest = "\n".join(FAILURE.format(idx=i + 1, rank=r, code=c) for i, (r, c) in enumerate(others))
    return (
        "=" * 60 + "\nfreeride_lab.pipeline.rank FAILED\n" + "-" * 60 + "\nFailures:\n"
        + (rest or "  <NO_OTHER_FAILURES>") + "\n" + "-" * 60
        + "\nRoot Cause (first observed failure):\n"
        + FAILURE.format(idx=0, rank=root[0], code=root[1]) + "\n" + "=" * 60 + "\n"
    )  # fmt: skip


def rank_failed(rd: RunDir, rank: int, t_ns: int, error: str) -> None:
    event = {"kind": "rank_failed", "schema_version": 1, "rank": rank, "t_ns": t_ns, "error": error}
    with open(rd.rank_events(rank), "a") as f:
        f.write(json.dumps(event) + "\n")


def test_a_rank_that_died_silently_is_the_cause_over_its_peers_reports(run_dir: RunDir) -> None:
    rank_failed(run_dir, 0, 100, "RuntimeError: Connection closed by peer")
    (run_dir.logs_dir / "torchrun.log").write_text(torchrun_log((0, 1), (1, -9)))
    assert failure_reason(run_dir, 1) == (1, "rank 1 was killed by SIGKILL")


def test_the_earliest_rank_failed_event_is_the_cause_when_none_died_silently(
    run_dir: RunDir,
) -> None:
    rank_failed(run_dir, 0, 200, "RuntimeError: Connection closed by peer")
    rank_failed(run_dir, 1, 100, "RuntimeError: injected")
    (run_dir.logs_dir / "torchrun.log").write_text(torchrun_log((0, 1), (1, 1)))
    assert failure_reason(run_dir, 1) == (1, "rank 1 failed: RuntimeError: injected")


def test_without_events_or_report_the_reason_is_torchrun_exit_code(run_dir: RunDir) -> None:
    (run_dir.logs_dir / "torchrun.log").write_text("usage: torchrun ...\nerror: bad option\n")
    assert failure_reason(run_dir, 2) == (None, "torchrun exited with code 2: error: bad option")


def test_a_terminal_run_state_cannot_change() -> None:
    assert advance(RunState.RUNNING, RunState.STOPPED) == RunState.STOPPED
    with pytest.raises(ValueError, match="finished cannot become stopped"):
        advance(RunState.FINISHED, RunState.STOPPED)


def test_each_final_state_has_its_own_launcher_exit_code() -> None:
    # the owner reads the verdict from the exit code when the status file could not be written
    assert len(set(EXIT_CODES.values())) == len(EXIT_CODES) == 3
    for state in (RunState.FINISHED, RunState.FAILED, RunState.STOPPED):
        assert state_of_exit_code(EXIT_CODES[state]) == state
    assert state_of_exit_code(-9) is None and state_of_exit_code(None) is None


def test_torchrun_keeps_sigint_ignored(run_dir: RunDir) -> None:
    rdzv = Rendezvous(
        nnodes=2, node_rank=1, nproc_per_node=4, master_addr="10.0.0.1", master_port=29500
    )
    cmd = torchrun_command(rdzv, run_dir)
    handled = cmd[cmd.index("--signals-to-handle") + 1].split(",")
    assert "SIGINT" not in handled and "SIGTERM" in handled
    assert cmd[cmd.index("--nproc-per-node") + 1] == "4"
    assert cmd[-4:] == ["-m", "freeride_lab.pipeline.rank", "--run-dir", str(run_dir.path)]


def test_torchrun_stopped_by_a_signal_says_so_in_one_line_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stop reaches torchrun as SIGTERM; its handler raises, and the log would show a
    traceback on every stop. It reads as what it is, with the status of a death by SIGTERM."""
    import signal

    import torch.distributed.run
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from freeride_lab.pipeline import torchrun

    def stopped(argv: list[str]) -> None:
        raise SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM)

    monkeypatch.setattr(torch.distributed.run, "main", stopped)
    assert torchrun.main(["--nproc-per-node", "1", "x.py"]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert err == "torchrun: stopped by SIGTERM, sent on to its ranks\n"
