"""The edge file's record: its layout, and a writer's and a reader's consistent copy of it.

# [Note: edge record and seqlock]
Layout (little-endian; offsets in bytes)::

    0   magic "FRE1"        4   version u32        8  readers u64 (see ``edge_wake``)
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
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

__all__ = [
    "FILE_BYTES",
    "HEADER",
    "NO_TIME",
    "Edge",
    "Mapping",
    "Phase",
    "header_bytes",
    "open_mapping",
    "read_record",
    "write_record",
]

_MAGIC = b"FRE1"
_VERSION = 3
FILE_BYTES = 128
HEADER = struct.Struct("<4sIQqq")  # magic, version, readers, clock_offset_ns, writer_pid
_READERS = struct.Struct("<Q")
_READERS_OFFSET = 8
_CLOCK = struct.Struct("<q")
_CLOCK_OFFSET = 16
_SEQ = struct.Struct("<Q")
_SEQ_OFFSET = 32
# seq, phase, step, slot, start, predicted_end, observed_end, previous step, slot, end
_PAYLOAD = struct.Struct("<QB7xqqqqqqqq")
_PAYLOAD_OFFSET = 40
_CRC = struct.Struct("<I")
_CRC_OFFSET = _PAYLOAD_OFFSET + _PAYLOAD.size
NO_TIME = -1


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


def header_bytes(clock_offset_ns: int) -> bytes:
    """A new file's header, written by this process."""
    return HEADER.pack(_MAGIC, _VERSION, 0, int(clock_offset_ns), os.getpid())


class Mapping:
    """The shared mapping of one edge file."""

    def __init__(self, path: Path, mm: mmap.mmap) -> None:
        self.path = path
        self.mm = mm

    def seq(self) -> int:
        return int(_SEQ.unpack_from(self.mm, _SEQ_OFFSET)[0])

    def clock_offset_ns(self) -> int:
        return int(_CLOCK.unpack_from(self.mm, _CLOCK_OFFSET)[0])

    def set_clock_offset_ns(self, offset_ns: int) -> None:
        _CLOCK.pack_into(self.mm, _CLOCK_OFFSET, int(offset_ns))

    def readers(self) -> int:
        """The readers word: a new reader stores a fresh token in it (see ``edge_wake``)."""
        return int(_READERS.unpack_from(self.mm, _READERS_OFFSET)[0])

    def set_readers(self, token: int) -> None:
        _READERS.pack_into(self.mm, _READERS_OFFSET, token)

    def close(self) -> None:
        if not self.mm.closed:
            self.mm.close()


def open_mapping(path: Path) -> Mapping:
    """Map the edge file at ``path``; ValueError if it is not one of this version."""
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size < FILE_BYTES:
            raise ValueError(
                f"edge file {str(path)!r} has {size} bytes, expected {FILE_BYTES}; "
                "it is not an edge file (or its writer is still creating it)"
            )
        mm = mmap.mmap(fd, FILE_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)  # the mapping stays valid without it
    mapping = Mapping(path, mm)
    magic, version = HEADER.unpack_from(mapping.mm, 0)[:2]
    if magic != _MAGIC or version != _VERSION:
        mapping.close()
        raise ValueError(
            f"edge file {str(path)!r} has magic {magic!r} version {version}, expected "
            f"{_MAGIC!r} version {_VERSION}; was it written by another freeride_lab version?"
        )
    return mapping


def write_record(mm: mmap.mmap, seq: int, phase: Phase, fields: tuple[int, ...]) -> None:
    """Publish record ``seq`` (even): ``fields`` are step, slot, start, predicted end, observed
    end, previous step, slot and end, as ``Edge`` has them (``NO_TIME`` for None)."""
    _SEQ.pack_into(mm, _SEQ_OFFSET, seq - 1)  # odd: a write is under way
    payload = _PAYLOAD.pack(seq, _PHASE_CODES[phase], *fields)
    mm[_PAYLOAD_OFFSET:_CRC_OFFSET] = payload
    _CRC.pack_into(mm, _CRC_OFFSET, zlib.crc32(payload))
    _SEQ.pack_into(mm, _SEQ_OFFSET, seq)


def read_record(mapping: Mapping, attempts: int = 1000) -> Edge | None:
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
            predicted_end_ns=None if predicted_ns == NO_TIME else predicted_ns,
            observed_end_ns=None if observed_ns == NO_TIME else observed_ns,
            previous_step=previous[0],
            previous_slot=previous[1],
            previous_end_ns=None if previous[2] == NO_TIME else previous[2],
        )
    return None
