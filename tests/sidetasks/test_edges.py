"""Bubble edges through shared memory: across processes, consistent, never blocking the writer."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from freeride_lab.sidetasks.edges import EdgeReader, EdgeWriter, Phase, edge_path
from freeride_lab.sidetasks.process import child_env


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return edge_path(tmp_path, 0)


def _python(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_edges_written_in_one_process_are_seen_in_another(path: Path) -> None:
    writer = EdgeWriter.create(path)
    reader_proc = _python(
        f"""
        from freeride_lab.sidetasks.edges import EdgeReader, Phase
        reader = EdgeReader.open({str(path)!r}, timeout_s=30)
        print("ready", flush=True)
        seen = []
        while True:
            edge = reader.wait(timeout_s=30)
            if edge is None or edge.phase is Phase.CLOSED:
                break
            seen.append((edge.phase.value, edge.step, edge.slot, edge.start_ns,
                         edge.predicted_end_ns, edge.observed_end_ns))
            print(repr(seen[-1]), flush=True)
        """
    )
    assert reader_proc.stdout is not None
    assert reader_proc.stdout.readline().strip() == "ready"
    writer.bubble_start(step=3, slot=1, t_ns=1000, predicted_end_ns=5000)
    assert reader_proc.stdout.readline().strip() == repr(("idle", 3, 1, 1000, 5000, None))
    writer.bubble_end(step=3, slot=1, t_ns=4000)
    assert reader_proc.stdout.readline().strip() == repr(("busy", 3, 1, 1000, 5000, 4000))
    writer.close()
    assert reader_proc.wait(timeout=30) == 0


def test_reader_never_sees_a_torn_record(path: Path) -> None:
    writer_proc = _python(
        f"""
        import sys
        from freeride_lab.sidetasks.edges import EdgeWriter
        writer = EdgeWriter.create({str(path)!r})
        print("ready", flush=True)
        sys.stdin.readline()
        for i in range(1, 200_000):
            writer.bubble_start(step=i, slot=i % 7, t_ns=10 * i, predicted_end_ns=10 * i + 5)
        writer.close()
        """
    )
    assert writer_proc.stdout is not None and writer_proc.stdin is not None
    assert writer_proc.stdout.readline().strip() == "ready"
    reader = EdgeReader.open(path)
    writer_proc.stdin.write("go\n")
    writer_proc.stdin.flush()
    checked = 0
    while True:
        edge = reader.latest()
        if edge is None:
            continue
        if edge.phase is Phase.CLOSED:
            break
        assert edge.slot == edge.step % 7
        assert edge.start_ns == 10 * edge.step
        assert edge.predicted_end_ns == 10 * edge.step + 5
        checked += 1
    assert writer_proc.wait(timeout=60) == 0
    assert checked > 0


def test_a_reader_sees_every_new_record_and_keeps_the_last_while_none_comes(
    path: Path,
) -> None:
    """``latest`` returns its last copy while nothing was written; any write after it, by
    this writer or one that takes the file over, gives the new record."""
    writer = EdgeWriter.create(path)
    reader = EdgeReader.open(path)
    assert reader.latest() is None
    writer.bubble_start(step=1, slot=0, t_ns=10, predicted_end_ns=20)
    first = reader.latest()
    assert first is not None and first.in_bubble and first.step == 1
    assert reader.latest() is first
    writer.bubble_end(step=1, slot=0, t_ns=15)
    ended = reader.latest()
    assert ended is not None and ended.observed_end_ns == 15 and ended.seq == first.seq + 1
    successor = EdgeWriter.create(path)  # a restarted rank takes the file over
    successor.bubble_start(step=2, slot=1, t_ns=30, predicted_end_ns=40)
    taken_over = reader.latest()
    assert taken_over is not None and (taken_over.step, taken_over.slot) == (2, 1)
    successor.close()
    closed = reader.latest()
    assert closed is not None and closed.phase is Phase.CLOSED


def test_wait_returns_none_after_its_timeout(path: Path) -> None:
    EdgeWriter.create(path)
    reader = EdgeReader.open(path)
    assert reader.wait(timeout_s=0.05) is None


def test_wait_returns_each_new_edge_once(path: Path) -> None:
    writer = EdgeWriter.create(path)
    reader = EdgeReader.open(path)
    writer.bubble_start(step=0, slot=0, t_ns=1, predicted_end_ns=2)
    first = reader.wait(timeout_s=1)
    assert first is not None and first.seq == 1 and first.in_bubble
    assert reader.wait(timeout_s=0.05) is None


def test_a_wait_past_a_given_edge_is_a_look_that_leaves_the_edge_new(path: Path) -> None:
    """A host waiting inside a bubble for its end (``after_seq`` = the bubble's edge) gets the
    end edge, and its main loop's next plain wait still gets it too."""
    writer = EdgeWriter.create(path)
    reader = EdgeReader.open(path)
    writer.bubble_start(step=0, slot=0, t_ns=1, predicted_end_ns=9)
    start = reader.wait(timeout_s=1)
    assert start is not None
    writer.bubble_end(step=0, slot=0, t_ns=5)
    looked = reader.wait(timeout_s=1, after_seq=start.seq)
    assert looked is not None and not looked.in_bubble
    assert reader.last_seq == start.seq
    again = reader.wait(timeout_s=1)
    assert again is not None and again.seq == looked.seq


def _write_later(writer: EdgeWriter, delay_s: float) -> threading.Thread:
    def write() -> None:
        time.sleep(delay_s)
        writer.bubble_start(step=0, slot=1, t_ns=5, predicted_end_ns=9)

    thread = threading.Thread(target=write)
    thread.start()
    return thread


def test_a_spinning_wait_sees_an_edge_without_sleeping(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = EdgeWriter.create(path)
    reader = EdgeReader.open(path)
    slept: list[float] = []
    real_sleep = reader._wake.sleep
    monkeypatch.setattr(reader._wake, "sleep", lambda s: (slept.append(s), real_sleep(s))[1])
    thread = _write_later(writer, 0.02)
    edge = reader.wait(timeout_s=5, spin_s=2.0)  # the edge comes well inside the spin
    thread.join()
    assert edge is not None and (edge.seq, edge.slot) == (1, 1)
    assert slept == []


@pytest.mark.parametrize("spin_s", [0.0, 2.0])
def test_a_new_edge_is_returned_before_any_system_call_and_its_wake_up_drained_later(
    path: Path, monkeypatch: pytest.MonkeyPatch, spin_s: float
) -> None:
    """A system call releases the GIL, which another thread of the host may then keep for the
    interpreter's switch interval: a wait that finds a new edge returns it without draining
    its FIFO. The edge's wake-up byte is drained at the next wait that finds nothing new,
    before it sleeps, so that sleep is not ended by it."""
    writer = EdgeWriter.create(path)
    reader = EdgeReader.open(path)
    calls: list[str] = []
    real_drain, real_sleep = reader._wake.drain, reader._wake.sleep
    monkeypatch.setattr(reader._wake, "drain", lambda: (calls.append("drain"), real_drain())[1])
    monkeypatch.setattr(reader._wake, "sleep",
                        lambda s: (calls.append("sleep"), real_sleep(s))[1])  # fmt: skip
    writer.bubble_start(step=0, slot=0, t_ns=1, predicted_end_ns=2)
    edge = reader.wait(timeout_s=5, spin_s=spin_s)
    assert edge is not None and edge.seq == 1
    assert calls == []
    assert reader.wait(timeout_s=0.05) is None
    assert calls[:2] == ["drain", "sleep"]
    assert reader._wake._read_fd >= 0
    with pytest.raises(BlockingIOError):  # the byte was drained before the sleep
        os.read(reader._wake._read_fd, 1)


def test_a_wait_whose_spin_sees_nothing_sleeps_until_the_edge(path: Path) -> None:
    writer = EdgeWriter.create(path)
    reader = EdgeReader.open(path)
    thread = _write_later(writer, 0.2)
    edge = reader.wait(timeout_s=10, spin_s=0.005)
    thread.join()
    assert edge is not None and edge.seq == 1
    assert reader.wait(timeout_s=0.05, spin_s=0.01) is None  # nothing new: the timeout holds


def test_interrupt_wakes_a_waiting_reader(path: Path) -> None:
    EdgeWriter.create(path)
    reader = EdgeReader.open(path)
    results: list[object] = []
    waiter = threading.Thread(target=lambda: results.append(reader.wait(timeout_s=30)))
    waiter.start()
    deadline = time.monotonic() + 10
    while waiter.is_alive() and time.monotonic() < deadline:
        reader.interrupt()
        waiter.join(0.05)
    assert not waiter.is_alive()
    assert results == [None]


def test_bubble_end_keeps_the_start_and_prediction_of_its_bubble(path: Path) -> None:
    writer = EdgeWriter.create(path)
    reader = EdgeReader.open(path)
    writer.bubble_start(step=5, slot=2, t_ns=100, predicted_end_ns=300)
    writer.bubble_end(step=5, slot=2, t_ns=250)
    edge = reader.latest()
    assert edge is not None
    assert (edge.phase, edge.start_ns, edge.predicted_end_ns, edge.observed_end_ns) == (
        Phase.BUSY,
        100,
        300,
        250,
    )


def test_next_edge_carries_the_end_of_the_previous_bubble(path: Path) -> None:
    writer = EdgeWriter.create(path)
    reader = EdgeReader.open(path)
    writer.bubble_start(step=5, slot=2, t_ns=100, predicted_end_ns=300)
    writer.bubble_end(step=5, slot=2, t_ns=250)
    writer.bubble_start(step=5, slot=3, t_ns=400, predicted_end_ns=500)
    edge = reader.latest()
    assert edge is not None
    assert (edge.previous_step, edge.previous_slot, edge.previous_end_ns) == (5, 2, 250)


def test_missing_prediction_reads_back_as_none(path: Path) -> None:
    writer = EdgeWriter.create(path)
    reader = EdgeReader.open(path)
    writer.bubble_start(step=0, slot=0, t_ns=100, predicted_end_ns=None)
    edge = reader.latest()
    assert edge is not None and edge.predicted_end_ns is None


def test_new_writer_on_the_same_file_continues_the_sequence(path: Path) -> None:
    first = EdgeWriter.create(path)
    reader = EdgeReader.open(path)
    first.bubble_start(step=0, slot=0, t_ns=1, predicted_end_ns=2)
    first.close()
    second = EdgeWriter.create(path)
    second.bubble_start(step=1, slot=0, t_ns=3, predicted_end_ns=4)
    edge = reader.latest()
    assert edge is not None and edge.seq == 3 and edge.step == 1


def test_clock_offset_is_shared_with_readers(path: Path) -> None:
    writer = EdgeWriter.create(path, clock_offset_ns=7)
    reader = EdgeReader.open(path)
    assert reader.clock_offset_ns == 7
    writer.set_clock_offset(-3)
    assert reader.clock_offset_ns == -3


def test_writer_counts_edges_after_close_instead_of_raising(path: Path) -> None:
    writer = EdgeWriter.create(path)
    writer.close()
    writer.bubble_start(step=0, slot=0, t_ns=1, predicted_end_ns=2)
    assert writer.errors == 1


def test_open_waits_for_the_file_then_names_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"rank-9\.edge"):
        EdgeReader.open(edge_path(tmp_path, 9), timeout_s=0.05)


def test_open_rejects_a_file_that_is_not_an_edge_file(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.edge"
    bogus.write_bytes(b"x" * 256)
    with pytest.raises(ValueError, match="magic"):
        EdgeReader.open(bogus)
