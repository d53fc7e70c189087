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

# [Note: edge record and seqlock]
Layout (little-endian; offsets in bytes)::

    0   magic "FRE1"        4   version u32        8  wake u32 (futex word)     12  pad
    16  clock_offset_ns i64 24  writer_pid i64
    32  seq u64 (odd while a write is under way)
    40  payload: seq u64, phase u8, 7 pad, step i64, slot i64, start_ns i64,
        predicted_end_ns i64, observed_end_ns i64, previous step, slot, end_ns i64 (-1 = none)
    120 crc32 of the payload

The writer makes ``seq`` odd, writes the payload, makes ``seq`` even again. A reader copies the
payload between two reads of ``seq`` and keeps the copy only if both reads are the same even
number, the payload repeats that number and its CRC matches. The CRC and the repeated number
make a torn read visible even where the CPU may reorder plain stores (Python gives no memory
barriers; x86 would not need them, aarch64 could).

# [Note: edge wake-up]
After each record the writer bumps the 32-bit ``wake`` word and calls ``futex(FUTEX_WAKE)`` on
it: one system call that never blocks and does nothing when no one waits. A reader reads
``wake``, checks the record and, if there is nothing new, calls ``futex(FUTEX_WAIT, wake)``,
which the kernel refuses at once if the word changed meanwhile, so no wake-up is lost. A futex
on a shared file mapping works across processes, wakes every reader at once and needs no file
descriptor to be handed over or subscribed (an eventfd or a pipe byte wakes only one reader and
must be inherited). ctypes releases the GIL during the wait. Where the futex system call is not
known (not Linux on x86-64 or aarch64) readers fall back to checking every 0.5 ms.

The writer never blocks and never raises: its methods run on the training hot path (house rule
16). Errors are counted in ``EdgeWriter.errors``.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import platform
import struct
import sys
import time
import zlib
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import TracebackType

from freeride_lab.io.rundir import create_file

log = logging.getLogger(__name__)

__all__ = [
    "Edge",
    "EdgeReader",
    "EdgeWriter",
    "Phase",
    "edge_path",
    "futex_available",
]

_MAGIC = b"FRE1"
_VERSION = 2
_FILE_BYTES = 128
_HEADER = struct.Struct("<4sIIIqq")  # magic, version, wake, pad, clock_offset_ns, writer_pid
_WAKE_OFFSET = 8
_SEQ = struct.Struct("<Q")
_SEQ_OFFSET = 32
# seq, phase, step, slot, start, predicted_end, observed_end, previous step, slot, end
_PAYLOAD = struct.Struct("<QB7xqqqqqqqq")
_PAYLOAD_OFFSET = 40
_CRC = struct.Struct("<I")
_CRC_OFFSET = _PAYLOAD_OFFSET + _PAYLOAD.size
_NO_TIME = -1
_FALLBACK_POLL_S = 0.0005
_MAX_WAIT_CHUNK_S = 0.25  # bounded futex waits keep Ctrl-C and interrupt() responsive


class Phase(StrEnum):
    """What the training rank is doing, as the newest edge says."""

    NONE = "none"  # no edge written yet
    IDLE = "idle"  # inside a bubble: side tasks may run
    BUSY = "busy"  # training computes: side tasks must not start work
    CLOSED = "closed"  # the rank finished; no more edges will come


_PHASE_CODES = {Phase.NONE: 0, Phase.IDLE: 1, Phase.BUSY: 2, Phase.CLOSED: 3}
_PHASES = {code: phase for phase, code in _PHASE_CODES.items()}


@dataclass(frozen=True, slots=True)
class Edge:
    """The newest bubble edge of a rank. Times are ns on the run clock.

    Args:
        seq: edges written so far by this rank (1 for the first); never goes back.
        phase: IDLE after a bubble start, BUSY after a bubble end, CLOSED at the end of training.
        step, slot: the training step and the index of the bubble among the rank's gaps in it.
        start_ns: when the bubble began (the bubble of ``step``/``slot``, also after its end).
        predicted_end_ns: when it was predicted to end; None when the rank had no prediction
            yet (iterative side tasks then leave the bubble alone).
        observed_end_ns: when it really ended; None while it lasts.
        previous_step, previous_slot, previous_end_ns: the last bubble that ended before this
            edge, and when (-1, -1, None before the first end). A reader that missed an end
            edge still learns when that bubble ended from the next edge.
    """

    seq: int
    phase: Phase
    step: int
    slot: int
    start_ns: int
    predicted_end_ns: int | None
    observed_end_ns: int | None
    previous_step: int = -1
    previous_slot: int = -1
    previous_end_ns: int | None = None

    @property
    def in_bubble(self) -> bool:
        """True while the bubble lasts (a start edge with no end yet)."""
        return self.phase is Phase.IDLE


def edge_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """The edge file of ``rank`` inside ``run_dir``."""
    return Path(run_dir) / "edges" / f"rank-{rank}.edge"


# --- futex --------------------------------------------------------------------------------

_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(
    platform.machine().lower()
)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Futex:
    """The two futex operations on one 32-bit word of a shared mapping (Linux only)."""

    def __init__(self) -> None:
        self.syscall = None
        if sys.platform.startswith("linux") and _SYS_FUTEX is not None:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                self.syscall = libc.syscall
                self.syscall.restype = ctypes.c_long
            except (OSError, AttributeError):
                self.syscall = None

    def wake_args(self, address: int) -> tuple[object, ...]:
        """Prepared arguments of FUTEX_WAKE(all) on ``address`` (built once: the call is hot)."""
        return (
            ctypes.c_long(_SYS_FUTEX or 0),
            ctypes.c_void_p(address),
            ctypes.c_int(_FUTEX_WAKE),
            ctypes.c_int(2**31 - 1),
            None,
            None,
            ctypes.c_int(0),
        )

    def wake_all(self, args: tuple[object, ...]) -> None:
        if self.syscall is not None:
            self.syscall(*args)

    def wait(self, address: int, expected: int, timeout_s: float) -> None:
        """Sleep while the word holds ``expected``, at most ``timeout_s`` (may return early)."""
        if self.syscall is None:
            time.sleep(min(timeout_s, _FALLBACK_POLL_S))
            return
        sec = int(timeout_s)
        ts = _Timespec(sec, int((timeout_s - sec) * 1e9))
        self.syscall(
            ctypes.c_long(_SYS_FUTEX or 0),
            ctypes.c_void_p(address),
            ctypes.c_int(_FUTEX_WAIT),
            ctypes.c_uint32(expected),
            ctypes.byref(ts),
            None,
            ctypes.c_int(0),
        )


_futex = _Futex()


def futex_available() -> bool:
    """True where readers sleep on a futex; False where they fall back to 0.5 ms checks."""
    return _futex.syscall is not None


# --- mapping ------------------------------------------------------------------------------


class _Mapping:
    """The mmap of an edge file plus the address of its futex word."""

    def __init__(self, path: Path, mm: mmap.mmap) -> None:
        self.path = path
        self.mm = mm
        self._word = ctypes.c_uint32.from_buffer(self.mm, _WAKE_OFFSET)
        self.wake_address = ctypes.addressof(self._word)
        self.wake_args = _futex.wake_args(self.wake_address)

    @property
    def wake(self) -> int:
        return int(self._word.value)

    def bump_wake(self) -> None:
        self._word.value = (self._word.value + 1) & 0xFFFFFFFF

    def seq(self) -> int:
        return int(_SEQ.unpack_from(self.mm, _SEQ_OFFSET)[0])

    def clock_offset_ns(self) -> int:
        return int(_HEADER.unpack_from(self.mm, 0)[4])

    def close(self) -> None:
        if self.mm.closed:
            return
        del self._word  # the ctypes view pins the buffer; drop it before closing
        self.mm.close()


def _open_mapping(path: Path) -> _Mapping:
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size < _FILE_BYTES:
            raise ValueError(
                f"edge file {str(path)!r} has {size} bytes, expected {_FILE_BYTES}; "
                "it is not an edge file (or its writer is still creating it)"
            )
        mm = mmap.mmap(fd, _FILE_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)  # the mapping stays valid without it
    mapping = _Mapping(path, mm)
    magic, version = _HEADER.unpack_from(mapping.mm, 0)[:2]
    if magic != _MAGIC or version != _VERSION:
        mapping.close()
        raise ValueError(
            f"edge file {str(path)!r} has magic {magic!r} version {version}, expected "
            f"{_MAGIC!r} version {_VERSION}; was it written by another freeride_lab version?"
        )
    return mapping


# --- writer -------------------------------------------------------------------------------


class EdgeWriter:
    """The rank's end: publishes bubble edges, never blocks, never raises.

    Its two methods are the ``edges`` interface the timed stage calls on the hot path.
    """

    def __init__(self, mapping: _Mapping) -> None:
        self._map = mapping
        self._seq = mapping.seq() & ~1  # continue after a previous writer of the same file
        self.edges_written = 0
        self.errors = 0
        self._closed = False
        self._open_bubble: tuple[int, int, int, int] = (-1, -1, _NO_TIME, _NO_TIME)
        self._last_end: tuple[int, int, int] = (-1, -1, _NO_TIME)

    @classmethod
    def create(cls, path: str | os.PathLike[str], *, clock_offset_ns: int = 0) -> EdgeWriter:
        """Create (or take over) the edge file at ``path`` and return its writer.

        A new file appears atomically with a valid header, so a reader never maps a half-made
        one. An existing edge file is reused in place and its sequence continues, so readers
        that already mapped it keep working.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        header = _HEADER.pack(_MAGIC, _VERSION, 0, 0, int(clock_offset_ns), os.getpid())
        if not path.exists():
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
            with os.fdopen(create_file(tmp), "wb") as f:
                f.write(header.ljust(_FILE_BYTES, b"\0"))
            os.replace(tmp, path)
            return cls(_open_mapping(path))
        mapping = _open_mapping(path)
        # Keep the wake word: a reader may be waiting on its current value.
        mapping.mm[16:32] = header[16:32]
        return cls(mapping)

    @property
    def path(self) -> Path:
        return self._map.path

    def set_clock_offset(self, clock_offset_ns: int) -> None:
        """Publish the rank's clock offset (after its clock sync) so readers share its run clock."""
        try:
            struct.pack_into("<q", self._map.mm, 16, int(clock_offset_ns))
        except Exception:
            self.errors += 1

    def bubble_start(self, step: int, slot: int, t_ns: int, predicted_end_ns: int | None) -> None:
        """A bubble began at ``t_ns`` and is predicted to end at ``predicted_end_ns`` (None: no
        prediction yet)."""
        predicted = _NO_TIME if predicted_end_ns is None else predicted_end_ns
        self._open_bubble = (step, slot, t_ns, predicted)
        self._publish(Phase.IDLE, step, slot, t_ns, predicted, _NO_TIME)

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
        self._publish(Phase.CLOSED, -1, -1, _NO_TIME, _NO_TIME, _NO_TIME)
        self._closed = True
        try:
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
            mm = self._map.mm
            seq = self._seq + 2
            _SEQ.pack_into(mm, _SEQ_OFFSET, seq - 1)  # odd: a write is under way
            payload = _PAYLOAD.pack(
                seq,
                _PHASE_CODES[phase],
                step,
                slot,
                start_ns,
                predicted_ns,
                observed_ns,
                *self._last_end,
            )
            mm[_PAYLOAD_OFFSET:_CRC_OFFSET] = payload
            _CRC.pack_into(mm, _CRC_OFFSET, zlib.crc32(payload))
            _SEQ.pack_into(mm, _SEQ_OFFSET, seq)
            self._seq = seq
            self.edges_written += 1
            self._map.bump_wake()
            _futex.wake_all(self._map.wake_args)
        except Exception:
            self.errors += 1

    def __enter__(self) -> EdgeWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"edges={self.edges_written}"
        return f"<EdgeWriter({str(self.path)!r}, {state}, errors={self.errors})>"


# --- reader -------------------------------------------------------------------------------


def _read_payload(mapping: _Mapping, attempts: int = 1000) -> Edge | None:
    """One consistent snapshot of the record, or None if there is none (yet) or no luck."""
    mm = mapping.mm
    for i in range(attempts):
        s1 = _SEQ.unpack_from(mm, _SEQ_OFFSET)[0]
        if s1 == 0:
            return None
        if s1 & 1:
            if i > 10:
                os.sched_yield()
            continue
        raw = mm[_PAYLOAD_OFFSET : _CRC_OFFSET + _CRC.size]
        if _SEQ.unpack_from(mm, _SEQ_OFFSET)[0] != s1:
            continue
        payload = raw[: _PAYLOAD.size]
        if _CRC.unpack_from(raw, _PAYLOAD.size)[0] != zlib.crc32(payload):
            continue
        seq, code, step, slot, start_ns, predicted_ns, observed_ns, *previous = _PAYLOAD.unpack(
            payload
        )
        if seq != s1:
            continue
        return Edge(
            seq=seq // 2,
            phase=_PHASES.get(code, Phase.NONE),
            step=step,
            slot=slot,
            start_ns=start_ns,
            predicted_end_ns=None if predicted_ns == _NO_TIME else predicted_ns,
            observed_end_ns=None if observed_ns == _NO_TIME else observed_ns,
            previous_step=previous[0],
            previous_slot=previous[1],
            previous_end_ns=None if previous[2] == _NO_TIME else previous[2],
        )
    return None


class EdgeReader:
    """A reader's end: the newest edge now (``latest``) or after a wait (``wait``).

    Several readers may map the same file; each keeps its own ``last_seq``.
    """

    def __init__(self, mapping: _Mapping) -> None:
        self._map = mapping
        self.last_seq = 0
        self._last: Edge | None = None
        self._interrupted = False

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
        return cls(_open_mapping(path))

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
        """The newest edge, or None before the first one. Does not change ``last_seq``."""
        edge = _read_payload(self._map)
        if edge is None:
            return self._last
        self._last = edge
        return edge

    def wait(
        self, timeout_s: float | None, *, after_seq: int | None = None, spin_s: float = 0.0
    ) -> Edge | None:
        """Block until an edge newer than ``after_seq`` exists, then return the newest edge.

        ``after_seq`` defaults to the last edge this reader returned from ``wait``. Returns
        None after ``timeout_s`` seconds (None = no limit) or when ``interrupt()`` is called.
        ``spin_s`` > 0 first checks the file in a busy loop for that long (no kernel wake-up
        to pay: a few µs instead of tens), then sleeps on the futex; spin only across a
        moment an edge is expected (``core.edge_timing.NextBubbleClock``), it burns a core.
        """
        after = self.last_seq if after_seq is None else after_seq
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        spin_until = time.perf_counter() + spin_s if spin_s > 0 else 0.0
        while True:
            word = self._map.wake
            edge = self.latest()
            if edge is not None and edge.seq > after:
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
            _futex.wait(self._map.wake_address, word, remaining)

    def interrupt(self) -> None:
        """Make a ``wait`` in another thread of this process return None soon.

        It wakes every waiter on the file; the others see nothing new and wait again.
        """
        self._interrupted = True
        _futex.wake_all(self._map.wake_args)

    def close(self) -> None:
        """Unmap the file. Idempotent."""
        self._map.close()

    def __enter__(self) -> EdgeReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<EdgeReader({str(self.path)!r}, last_seq={self.last_seq})>"
