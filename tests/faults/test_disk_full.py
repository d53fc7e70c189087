"""A disk that fills while a run writes its events: training is not stopped by
telemetry, events that cannot be written wait in a bounded backlog (beyond it they are dropped
and counted), writing resumes once there is room again, and the run directory stays readable.

The disk is a real, small tmpfs mounted for the test (root only; skipped otherwise), filled by
a file until the kernel answers ENOSPC. See [Note: a full disk] in ``io/sink.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from runs import synthetic_config
from waits import run_processes, wait_until

from freeride_lab.core.config import RunConfig
from freeride_lab.core.events import StepTimed
from freeride_lab.core.runtime_options import RuntimeOptions
from freeride_lab.io.sink import EventSink
from freeride_lab.lab.session import Session
from freeride_lab.pipeline.launcher import RunState

pytestmark = pytest.mark.slow  # whole runs on a size-capped file system

DISK_BYTES = 80 << 20  # above the 64 MiB a launch asks for (lab/preflight.py MIN_FREE_BYTES)
STARTUP_S = 180.0  # first step of a fresh run on a loaded two-core box
FULL_FOR_S = 3.0  # how long the run trains on a full disk
STEPS = 120
CONFIG = synthetic_config(
    steps=STEPS, phase_ms=10.0, seed=5, side_tasks=False, runtime=RuntimeOptions()
)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A fresh 80 MiB tmpfs, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES},mode=0700", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


@contextlib.contextmanager
def training_on(disk: Path, config: RunConfig) -> Iterator[Session]:
    """A run of ``config`` in ``disk``, once it trained its first steps; on the way out it is
    stopped and every process of it has exited."""
    run_dir = disk / "run"
    run = Session.launch(config, run_dir=run_dir, grace_s=3)
    try:
        wait_until(
            lambda: run.steps_done >= 2, timeout_s=STARTUP_S, what="the first training steps"
        )
        yield run
    finally:
        run.stop()
    wait_until(
        lambda: not run_processes(run_dir), timeout_s=10, what="every process of the run to exit"
    )


def fill(disk: Path) -> Path:
    """Write a file until the disk is full (ENOSPC); returns it (delete it to free the disk)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):
            block = b"\0" * size
            with contextlib.suppress(OSError):
                while os.write(fd, block):
                    pass
        with pytest.raises(OSError) as full:
            os.write(fd, b"\0")
        assert full.value.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def step_event(step: int) -> StepTimed:
    return StepTimed(
        rank=0,
        step=step,
        start_ns=step,
        end_ns=step + 1,
        optimizer_start_ns=step,
        optimizer_end_ns=step + 1,
        loss=1.0,
    )


def file_steps(path: Path) -> list[int]:
    """The step numbers in an event file; every line must be whole JSON."""
    return [json.loads(line)["step"] for line in path.read_bytes().splitlines()]


# -- the sink alone ------------------------------------------------------------------------------


def test_a_sink_on_a_full_disk_keeps_its_events_and_writes_them_once_there_is_room(
    small_disk: Path,
) -> None:
    sink = EventSink(small_disk / "events" / "rank-0.jsonl", retry_s=0.1)
    try:
        sink.emit(step_event(0))
        wait_until(
            lambda: file_steps(sink.path) == [0], timeout_s=10, what="the first event on disk"
        )
        filler = fill(small_disk)
        for step in range(1, 2001):  # far more than the last page of the file can take
            sink.emit(step_event(step))
        wait_until(lambda: sink.write_errors > 0, timeout_s=10, what="a failed write")
        assert sink.unwritten > 0 and "No space left" in sink.last_write_error
        assert file_steps(sink.path) == [0]  # cut back to its last whole line
        filler.unlink()
        wait_until(lambda: sink.unwritten == 0, timeout_s=10, what="the backlog to be written")
        sink.emit(step_event(2001))
    finally:
        sink.close()
    assert file_steps(sink.path) == list(range(2002))
    assert sink.dropped == 0


def test_a_sink_drops_and_counts_what_does_not_fit_its_backlog_and_then_resumes(
    small_disk: Path,
) -> None:
    sink = EventSink(small_disk / "rank-0.jsonl", retry_s=0.1, backlog_bytes=4096)
    try:
        filler = fill(small_disk)
        for step in range(1000):
            sink.emit(step_event(step))
            if step % 100 == 0:
                sink.flush()
        wait_until(
            lambda: sink.dropped > 0, timeout_s=10, what="events beyond the backlog to be dropped"
        )
        filler.unlink()
        wait_until(lambda: sink.unwritten == 0, timeout_s=10, what="the backlog to be written")
        sink.emit(step_event(1000))
    finally:
        sink.close()
    steps = file_steps(sink.path)  # whole lines only, in order, the last one written after
    assert steps == sorted(steps) and steps[-1] == 1000
    assert len(steps) + sink.dropped == 1001


def test_closing_a_sink_on_a_full_disk_counts_the_unwritten_events_as_dropped(
    small_disk: Path,
) -> None:
    sink = EventSink(small_disk / "rank-0.jsonl", retry_s=60)
    filler = fill(small_disk)
    for step in range(2000):
        sink.emit(step_event(step))
    sink.close(timeout_s=5)
    assert sink.dropped == 2000 - len(file_steps(sink.path)) > 0
    filler.unlink()


# -- a real run ----------------------------------------------------------------------------------


def test_a_run_trains_through_a_full_disk_and_writes_its_events_once_there_is_room(
    small_disk: Path,
) -> None:
    with training_on(small_disk, CONFIG) as run:
        run_dir = run.run_dir.path
        filler = fill(small_disk)
        full_ns = time.time_ns()
        deadline = time.monotonic() + FULL_FOR_S  # the fault lasts this long; nothing to await
        while time.monotonic() < deadline:
            assert not run.state.done, f"the run ended on a full disk: {run.state} {run.failure}"
            time.sleep(0.2)
        freed_ns = time.time_ns()
        filler.unlink()

        assert run.wait(timeout_s=STARTUP_S) == RunState.FINISHED, run.failure
        steps = run.events.query("kind == 'step'")
        during = steps[(steps["end_ns"] > full_ns) & (steps["end_ns"] < freed_ns)]
        # training completed steps while the disk was full, and their events were kept
        assert set(during["rank"]) == {0, 1}, f"no step ended on the full disk: {len(during)}"
        assert sorted(zip(run.steps["step"], run.steps["rank"], strict=True)) == [
            (s, r) for s in range(STEPS) for r in range(2)
        ]
        finished = run.events.query("kind == 'rank_finished'")
        assert finished["dropped_events"].tolist() == [0, 0]
        logs = " ".join(p.read_text() for p in (run_dir / "logs").glob("**/stderr.log"))
        assert "writing again after" in logs  # each rank's log tells of the outage

        for path in sorted((run_dir / "events").glob("*.jsonl")):  # no line torn by the full disk
            assert all(json.loads(line) for line in path.read_bytes().splitlines()), path
        assert len(Session.open(run_dir).steps) == STEPS * 2


def test_a_run_that_ends_on_a_full_disk_is_still_reported_finished(small_disk: Path) -> None:
    # The launcher cannot write its final status; the owner settles the run from what it saw.
    with training_on(small_disk, dataclasses.replace(CONFIG, steps=12)) as run:
        filler = fill(small_disk)
        end = run.wait(timeout_s=STARTUP_S)
        assert end == RunState.FINISHED, run.failure
        assert run.failure is None
        filler.unlink()
