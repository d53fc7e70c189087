"""Wake-ups from an edge file's writer to readers in other processes: every reader, none lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from freeride_lab.sidetasks.edge_wake import wake_dir
from freeride_lab.sidetasks.edges import EdgeReader, EdgeWriter, edge_path
from freeride_lab.sidetasks.process import child_env

# A reader that sleeps on its wake-up alone (no record check, no bounded chunks): it only
# prints "woke" if the writer's wake-up reached it.
SLEEPER = textwrap.dedent(
    """
    import sys
    from freeride_lab.sidetasks.edges import EdgeReader
    reader = EdgeReader.open(sys.argv[1], timeout_s=30)
    reader._wake.drain()
    print("ready", flush=True)
    reader._wake.sleep(120)
    print("woke", flush=True)
    sys.stdin.readline()
    """
)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return edge_path(tmp_path, 0)


def _sleeper(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SLEEPER, str(path)],
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _fifos(path: Path) -> list[str]:
    return sorted(p.name for p in wake_dir(path).glob("*.fifo"))


def _woke_within(proc: subprocess.Popen[str], timeout_s: float) -> bool:
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline().strip()))
    reader.daemon = True
    reader.start()
    reader.join(timeout_s)
    return lines == ["woke"]


def test_one_edge_wakes_every_reader_process(path: Path) -> None:
    writer = EdgeWriter.create(path)
    sleepers = [_sleeper(path), _sleeper(path)]
    try:
        writer.bubble_start(step=0, slot=0, t_ns=1, predicted_end_ns=2)
        assert all(_woke_within(p, 30.0) for p in sleepers)
    finally:
        for proc in sleepers:
            proc.kill()
            proc.wait()
        writer.close()


def test_a_new_writer_of_the_file_wakes_the_readers_already_there(path: Path) -> None:
    EdgeWriter.create(path).close()
    sleeper = _sleeper(path)
    try:
        second = EdgeWriter.create(path)
        second.bubble_start(step=0, slot=0, t_ns=1, predicted_end_ns=2)
        assert _woke_within(sleeper, 30.0)
        second.close()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_wake_up_of_a_reader_that_died_is_removed_by_the_writer(path: Path) -> None:
    writer = EdgeWriter.create(path)
    writer.bubble_start(step=0, slot=0, t_ns=1, predicted_end_ns=2)  # lists no reader yet
    sleeper = _sleeper(path)
    before_death = EdgeReader.open(path)  # this one stays
    assert len(_fifos(path)) == 2
    os.kill(sleeper.pid, signal.SIGKILL)
    sleeper.wait()
    writer.bubble_end(step=0, slot=0, t_ns=3)
    assert len(_fifos(path)) == 1
    assert writer.errors == 0
    before_death.close()
    assert _fifos(path) == []
    writer.close()


def test_a_writer_counts_the_readers_there_are_now(path: Path) -> None:
    """A reader counts from when it opens the file; one that died, once an edge found it
    gone; a closed writer has none."""
    writer = EdgeWriter.create(path)
    assert writer.readers == 0
    sleeper = _sleeper(path)
    assert writer.readers == 1  # before any edge
    os.kill(sleeper.pid, signal.SIGKILL)
    sleeper.wait()
    writer.bubble_start(step=0, slot=0, t_ns=1, predicted_end_ns=2)
    assert writer.readers == 0
    stays = EdgeReader.open(path)
    assert writer.readers == 1
    writer.close()
    assert writer.readers == 0
    stays.close()


def test_a_short_sleep_is_asked_of_the_kernel_to_the_microsecond(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader sleeps until just before an edge it expects, then spins: its sleep must not
    be rounded up to a whole millisecond (``poll``'s unit), or it wakes after the edge."""
    import select

    from freeride_lab.sidetasks import edge_wake

    EdgeWriter.create(path)
    reader = EdgeReader.open(path)
    asked: list[float] = []
    real_select = select.select

    def recording_select(r: list[int], w: list[int], x: list[int], timeout: float) -> tuple:
        asked.append(timeout)
        return real_select(r, w, x, 0)

    monkeypatch.setattr(edge_wake.select, "select", recording_select)
    reader._wake.sleep(0.0003)
    reader._wake.sleep(-1.0)  # a deadline already past: no wait at all
    assert asked == [0.0003, 0.0]
    reader.close()
