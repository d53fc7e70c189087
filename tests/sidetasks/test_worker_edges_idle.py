"""A side-task worker with no active task is not woken at every bubble edge: the training rank
publishes its edges without writing to any FIFO of it, the worker still notices the end of
training, and it is woken at every edge again once a task is active
(``sidetasks.worker_edges`` [Note: a worker without a task is not woken])."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from freeride_lab.sidetasks.edge_record import open_mapping
from freeride_lab.sidetasks.edge_wake import wake_dir
from freeride_lab.sidetasks.edges import EdgeReader, EdgeWriter, edge_path
from freeride_lab.sidetasks.worker_edges import watch_edges

WAIT_S = 10.0


def fifos(path: Path) -> list[str]:
    return sorted(p.name for p in wake_dir(path).glob("*.fifo"))


def muted(path: Path) -> bool:
    """The edge thread has opened its reader and muted it: the reader's token is in the file's
    readers word (stored once its FIFO was in place) and that FIFO is gone again.

    "No FIFO" alone also holds before the thread has opened its reader. The FIFO it opens with
    can then still appear and, when the thread looked for a task just before one was made
    active, be counted as the active task's FIFO and vanish at the thread's first mute."""
    mapping = open_mapping(path)
    try:
        return mapping.readers() != 0 and fifos(path) == []
    finally:
        mapping.close()


def eventually(check: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return check()


class EdgeThread:
    """``watch_edges`` on its own thread, with the active task set by the test."""

    def __init__(self, path: Path) -> None:
        self.task: Any = None
        self.closed = threading.Event()
        self.stopping = False
        self.thread = threading.Thread(
            target=watch_edges,
            args=(path,),
            kwargs={
                "stopping": lambda: self.stopping,
                "active": lambda: self.task,
                "on_clock_offset": lambda offset: None,
                "on_closed": self.closed.set,
            },
            daemon=True,
        )
        self.thread.start()

    def stop(self) -> None:
        self.stopping = True
        self.thread.join(WAIT_S)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return edge_path(tmp_path, 0)


@pytest.fixture
def writer(path: Path) -> Iterator[EdgeWriter]:
    w = EdgeWriter.create(path)
    yield w
    w.close()


def publish(writer: EdgeWriter, step: int, n: int = 20) -> None:
    for slot in range(n):
        writer.bubble_start(step, slot, time.time_ns(), None)
        writer.bubble_end(step, slot, time.time_ns())


def test_no_task_no_fifo_the_rank_writes_to(path: Path, writer: EdgeWriter) -> None:
    edges = EdgeThread(path)
    try:
        assert eventually(lambda: muted(path))
        publish(writer, 0)
        assert fifos(path) == []  # nothing for the rank to wake
        edges.task = SimpleNamespace(busy=True, alive=True)  # a task became active
        assert eventually(lambda: len(fifos(path)) == 1)
        publish(writer, 1)
        assert len(fifos(path)) == 1  # woken at every edge again
        edges.task = None
        assert eventually(lambda: fifos(path) == [])
    finally:
        edges.stop()


def test_the_end_of_training_is_noticed_without_a_task(path: Path, writer: EdgeWriter) -> None:
    edges = EdgeThread(path)
    try:
        assert eventually(lambda: muted(path))
        publish(writer, 0)
        writer.close()
        assert edges.closed.wait(WAIT_S)
    finally:
        edges.stop()


def test_a_muted_reader_still_reads_the_newest_edge_and_is_woken_once_unmuted(
    path: Path, writer: EdgeWriter
) -> None:
    reader = EdgeReader.open(path)
    try:
        reader.mute()
        assert reader.muted and fifos(path) == []
        publish(writer, 3, n=2)
        edge = reader.wait(timeout_s=0)
        assert edge is not None and (edge.step, edge.slot) == (3, 1)
        reader.unmute()
        assert not reader.muted and len(fifos(path)) == 1
        woke = threading.Event()

        def wait() -> None:
            if reader.wait(timeout_s=WAIT_S) is not None:
                woke.set()

        waiter = threading.Thread(target=wait, daemon=True)
        waiter.start()
        publish(writer, 4, n=1)
        assert woke.wait(WAIT_S)
        waiter.join(WAIT_S)
    finally:
        reader.close()
