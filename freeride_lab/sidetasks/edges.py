"""Bubble edges from a training rank to the processes beside it, through shared memory.

One small file per rank, ``<run_dir>/edges/rank-<r>.edge``, mapped by the rank (one writer) and
by any number of readers (the rank's side-task worker, the task process it runs)::

    writer = EdgeWriter.create(edge_path(run_dir, rank), clock_offset_ns=offset)
    writer.bubble_start(step=7, slot=1, t_ns=now_ns, predicted_end_ns=now_ns + 40_000_000)
    writer.bubble_end(step=7, slot=1, t_ns=later_ns)

    reader = EdgeReader.open(edge_path(run_dir, rank), timeout_s=10)
    edge = reader.wait(timeout_s=1.0)      # the newest edge, or None after a quiet second
    if edge is not None and edge.in_bubble: ...

The file holds one record, ``Edge``: the newest edge only. A reader that wakes late sees the
newest state, never a backlog; that is what a side task needs (is there a bubble now, and until
when?). The full history goes to the event files, written by the rank.

The file's layout and its torn-read guarantees are in ``edge_record`` ([Note: edge record
and seqlock]); how a writer wakes its readers in other processes is in ``edge_wake`` ([Note:
edge wake-up]).

The writer never blocks and never raises: its methods run on the training hot path (house rule
16). Errors are counted in ``EdgeWriter.errors``.

[Note: no syscall before the edge]
A reader looks at the record before it drains its FIFO, and drains only when nothing is new.
Every system call releases the GIL, and a task host's other threads (its event sink's writer,
its command reader) may take it there: the host gets it back when they block or, if one is
busy, after the interpreter's switch interval (5 ms). Between the host's spin (or wake-up)
seeing an edge and its first ``step()`` that wait is signal latency; on the CPU the drain's
read was where about one bubble in a hundred lost 5 ms. The wake-up byte of an edge returned
without a drain stays in the FIFO until the reader next finds nothing new, and is drained then,
before it sleeps: no wake-up is lost, and none ends a sleep early.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from freeride_lab.io.rundir import create_file
from freeride_lab.sidetasks.edge_record import (
    FILE_BYTES,
    HEADER,
    NO_TIME,
    Edge,
    Mapping,
    Phase,
    header_bytes,
    open_mapping,
    read_record,
    write_record,
)
from freeride_lab.sidetasks.edge_wake import WakeReceiver, WakeSender, wake_dir

__all__ = ["Edge", "EdgeReader", "EdgeWriter", "Phase", "edge_path", "leftovers_path"]

_MAX_WAIT_CHUNK_S = 0.25  # bounded waits keep Ctrl-C and interrupt() responsive


def edge_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """The edge file of ``rank`` inside ``run_dir``."""
    return Path(run_dir) / "edges" / f"rank-{rank}.edge"


def leftovers_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """The edge file through which the main side task of ``rank`` hands on the bubble time
    it leaves to the rank's leftovers task (gating "leftovers"; ``host.iterative`` [Note:
    leftovers])."""
    return Path(run_dir) / "edges" / f"rank-{rank}.leftovers.edge"


class EdgeWriter:
    """The rank's end: publishes bubble edges, never blocks, never raises.

    Its two methods are the ``edges`` interface the timed stage calls on the hot path.
    """

    def __init__(self, mapping: Mapping) -> None:
        self._map = mapping
        self._wake = WakeSender(wake_dir(mapping.path), mapping.readers)
        self._seq = mapping.seq() & ~1  # continue after a previous writer of the same file
        self.edges_written = 0
        self.errors = 0
        self._closed = False
        self._open_bubble: tuple[int, int, int, int] = (-1, -1, NO_TIME, NO_TIME)
        self._last_end: tuple[int, int, int] = (-1, -1, NO_TIME)

    @classmethod
    def create(cls, path: str | os.PathLike[str], *, clock_offset_ns: int = 0) -> EdgeWriter:
        """Create (or take over) the edge file at ``path`` and return its writer.

        A new file appears atomically with a valid header, so a reader never maps a half-made
        one. An existing edge file is reused in place and its sequence continues, so readers
        that already mapped it keep working.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        header = header_bytes(clock_offset_ns)
        if not path.exists():
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
            with os.fdopen(create_file(tmp), "wb") as f:
                f.write(header.ljust(FILE_BYTES, b"\0"))
            os.replace(tmp, path)
            return cls(open_mapping(path))
        mapping = open_mapping(path)
        # Keep the readers word: the readers mapped now go on being woken.
        mapping.mm[16 : HEADER.size] = header[16:]
        return cls(mapping)

    @property
    def path(self) -> Path:
        return self._map.path

    @property
    def readers(self) -> int:
        """How many readers the file has (one that has gone is dropped at the next edge)."""
        return 0 if self._closed else self._wake.readers

    def set_clock_offset(self, clock_offset_ns: int) -> None:
        """Publish the rank's clock offset (after its clock sync) so readers share its run clock."""
        try:
            self._map.set_clock_offset_ns(clock_offset_ns)
        except Exception:
            self.errors += 1

    def bubble_start(self, step: int, slot: int, t_ns: int, predicted_end_ns: int | None) -> None:
        """A bubble began at ``t_ns`` and is predicted to end at ``predicted_end_ns`` (None: no
        prediction yet)."""
        predicted = NO_TIME if predicted_end_ns is None else predicted_end_ns
        self._open_bubble = (step, slot, t_ns, predicted)
        self._publish(Phase.IDLE, step, slot, t_ns, predicted, NO_TIME)

    def bubble_end(self, step: int, slot: int, t_ns: int) -> None:
        """The bubble ``step``/``slot`` really ended at ``t_ns`` (training resumed)."""
        if self._open_bubble[:2] == (step, slot):
            start_ns, predicted_end_ns = self._open_bubble[2:]
        else:
            start_ns, predicted_end_ns = t_ns, t_ns  # an end without its start: zero length
        self._last_end = (step, slot, t_ns)
        self._publish(Phase.BUSY, step, slot, start_ns, predicted_end_ns, t_ns)

    def close(self) -> None:
        """Publish CLOSED (training over; readers stop waiting) and unmap. Idempotent."""
        if self._closed:
            return
        self._publish(Phase.CLOSED, -1, -1, NO_TIME, NO_TIME, NO_TIME)
        self.release()

    def release(self) -> None:
        """Unmap without publishing anything: the file stays open to its readers, and a later
        writer takes it over where this one left it (``create``). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._wake.close()
            self._map.close()
        except Exception:
            self.errors += 1

    def _publish(
        self, phase: Phase, step: int, slot: int, start_ns: int, predicted_ns: int, observed_ns: int
    ) -> None:
        if self._closed:
            self.errors += 1
            return
        try:
            seq = self._seq + 2
            fields = (step, slot, start_ns, predicted_ns, observed_ns, *self._last_end)
            write_record(self._map.mm, seq, phase, fields)
            self._seq = seq
            self.edges_written += 1
            self._wake.wake_all()
        except Exception:
            self.errors += 1

    def __enter__(self) -> EdgeWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"edges={self.edges_written}"
        return f"<EdgeWriter({str(self.path)!r}, {state}, errors={self.errors})>"


class EdgeReader:
    """A reader's end: the newest edge now (``latest``) or after a wait (``wait``).

    Several readers may map the same file; each keeps its own ``last_seq``.
    """

    def __init__(self, mapping: Mapping) -> None:
        self._map = mapping
        self._wake = WakeReceiver(wake_dir(mapping.path), mapping.set_readers)
        self.last_seq = 0
        self._last: Edge | None = None
        self._interrupted = False
        self._muted = False

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, timeout_s: float = 0.0) -> EdgeReader:
        """Map the edge file at ``path``, waiting up to ``timeout_s`` for its writer to create it.

        Raises:
            FileNotFoundError: no edge file appeared in time.
            ValueError: the file is not an edge file of this version.
        """
        path = Path(path)
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if time.monotonic() >= deadline:
                raise FileNotFoundError(
                    f"no edge file at {str(path)!r} after {timeout_s} s; the rank creates it "
                    "with EdgeWriter.create() before it starts its worker"
                )
            time.sleep(0.01)
        return cls(open_mapping(path))

    @property
    def path(self) -> Path:
        return self._map.path

    @property
    def clock_offset_ns(self) -> int:
        """The writer's clock offset: ``time.time_ns() + clock_offset_ns`` is run time."""
        return self._map.clock_offset_ns()

    def now_ns(self) -> int:
        """Now on the run clock of the writer."""
        return time.time_ns() + self._map.clock_offset_ns()

    def latest(self) -> Edge | None:
        """The newest edge, or None before the first one. Does not change ``last_seq``.

        While the file's sequence word still reads what it did at the last copy, nothing was
        written since (a write changes it before and after), so the last copy is returned
        without copying and checking the record again: the host looks often, mostly at an
        edge it has seen.
        """
        last = self._last
        if last is not None and self._map.seq() == 2 * last.seq:
            return last
        edge = read_record(self._map)
        if edge is None:
            return self._last
        self._last = edge
        return edge

    def wait(
        self, timeout_s: float | None, *, after_seq: int | None = None, spin_s: float = 0.0
    ) -> Edge | None:
        """Block until an edge newer than ``after_seq`` exists, then return the newest edge.

        ``after_seq`` defaults to the last edge this reader returned from ``wait``; given, the
        wait is a look past that edge and leaves ``last_seq`` as it was, so the edge it returns
        is still new to the next ``wait`` without one (the caller keeps its own place). Returns
        None after ``timeout_s`` seconds (None = no limit) or when ``interrupt()`` is called.
        ``spin_s`` > 0 first checks the file in a busy loop for that long (no kernel wake-up
        to pay: a few µs instead of tens), then sleeps until woken; spin only across a
        moment an edge is expected (``core.edge_timing.NextBubbleClock``), it burns a core.
        """
        after = self.last_seq if after_seq is None else after_seq
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        spin_until = time.perf_counter() + spin_s if spin_s > 0 else 0.0
        while True:
            edge = self.latest()
            if edge is None or edge.seq <= after:
                # nothing new: consume the wake-ups so far, then look again before sleeping (a
                # byte written after the drain stays for the sleep) [Note: no syscall before
                # the edge]
                self._wake.drain()
                edge = self.latest()
            if edge is not None and edge.seq > after:
                if after_seq is None:
                    self.last_seq = edge.seq
                return edge
            if self._interrupted:
                self._interrupted = False
                return None
            if spin_until:
                seq_word = 2 * after + 2  # the file's sequence word once edge after+1 is whole
                while self._map.seq() < seq_word and time.perf_counter() < spin_until:
                    pass
                if self._map.seq() >= seq_word:
                    continue
                spin_until = 0.0
            remaining = _MAX_WAIT_CHUNK_S
            if deadline is not None:
                remaining = min(remaining, deadline - time.monotonic())
                if remaining <= 0:
                    return None
            self._wake.sleep(remaining)

    def mute(self) -> None:
        """Stop the writer's wake-ups to this reader: it removes its FIFO, so publishing an edge
        no longer wakes this process (nor costs the training rank a write for it). For a reader
        that only looks now and then: while muted, call ``wait`` with ``timeout_s=0`` or
        ``latest``; a longer ``wait`` checks the file every 0.5 ms. Idempotent."""
        if not self._muted:
            self._muted = True
            self._wake.close()

    def unmute(self) -> None:
        """Be woken at every edge again (a new FIFO, registered with the writer). Idempotent."""
        if self._muted:
            self._muted = False
            self._wake = WakeReceiver(wake_dir(self._map.path), self._map.set_readers)

    @property
    def muted(self) -> bool:
        """True between ``mute`` and ``unmute``."""
        return self._muted

    def interrupt(self) -> None:
        """Make a ``wait`` in another thread of this process return None soon.

        It wakes this reader only (through its own FIFO, see ``edge_wake``).
        """
        self._interrupted = True
        self._wake.poke()

    def close(self) -> None:
        """Unmap the file and remove this reader's FIFO. Idempotent."""
        self._wake.close()
        self._map.close()

    def __enter__(self) -> EdgeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<EdgeReader({str(self.path)!r}, last_seq={self.last_seq})>"
