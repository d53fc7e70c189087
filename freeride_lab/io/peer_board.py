"""Each rank's action starts, published for its neighbours: when the output a bubble waits for
should come ([Note: awaited peer] in ``core.peer_prediction``).

One small file per rank, ``<run_dir>/edges/rank-<r>.actions``, written by the rank (one writer)
and mapped read-only by its neighbours::

    board = PeerBoard.create(peer_board_path(run_dir, rank))
    board.publish(step=7, stage=1, kind=ActionKind.FORWARD, microbatch=3,
                  start_ns=now_ns, end_ns=now_ns + expected_ns)

    boards = PeerBoards(run_dir)
    boards.end_of(rank=1, step=7, stage=1, kind=ActionKind.FORWARD, microbatch=3)  # or None

The file is a header (magic, version, entry count), one *awaiting* record and a ring of the
rank's last ``ENTRIES`` action starts, each record under a sequence number of its own (a
seqlock: odd while the writer writes it, so a reader that sees it odd, or changed by the end
of its read, takes nothing from it). A backward is found by its stage and micro-batch whether
it ran whole (B) or as its input half (I): the rank waiting for it receives the same gradient
either way.

The awaiting record names the action a bubble the rank announced waits for, where its feeder
had not started it when the bubble began, and the hand-over the rank adds to a feeder's end
(``PeerBoard.awaiting``): the side task in that bubble, once the rank's prediction has run out,
reads the feeder's end when it comes ([Note: told mid-bubble] in ``sidetasks.host.iterative``).

Like the edge files, the writer runs on the training hot path: it never blocks and never
raises (errors are counted). A reader treats any file it cannot map or whose header is not
this version's as absent, and looks again at most once a second; what it reads is a
neighbour's claim, which the predictor bounds (``core.peer_prediction``).
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from freeride_lab.core.schedule import ActionKind, feeding_stage
from freeride_lab.io.rundir import create_file

log = logging.getLogger(__name__)

__all__ = ["ENTRIES", "AwaitedPeers", "Awaiting", "PeerBoard", "PeerBoards", "peer_board_path"]

ENTRIES = 8  # a rank's last action starts kept: a neighbour reads one within a few actions
_MAGIC = b"FRLACTS\0"
_VERSION = 2
_HEADER = struct.Struct("<8sII")  # magic, version, entries
# seq, step, slot, feeder rank, its stage, kind code, micro-batch, (pad), hand-over ns
_AWAITING = struct.Struct("<Qqiiiiiiq")
# seq, step, stage, kind code, micro-batch, (pad), start, end (run clock, ns)
_ENTRY = struct.Struct("<QqiiiiQQ")
_RING = _HEADER.size + _AWAITING.size
FILE_BYTES = _RING + ENTRIES * _ENTRY.size
_KIND_CODES = {kind: i + 1 for i, kind in enumerate(ActionKind)}
_KINDS = {code: kind for kind, code in _KIND_CODES.items()}
_BACKWARD = {_KIND_CODES[ActionKind.BACKWARD], _KIND_CODES[ActionKind.BACKWARD_INPUT]}
_REOPEN_S = 1.0  # a missing or foreign file is looked for again at most this often


def peer_board_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """The action board of ``rank`` inside ``run_dir``."""
    return Path(run_dir) / "edges" / f"rank-{rank}.actions"


@dataclass(frozen=True, slots=True)
class Awaiting:
    """The action a rank's bubble (``step``, ``slot``) waits for: ``kind`` of ``microbatch`` on
    ``stage``, run by ``rank``, in the same step; the rank takes the bubble to end
    ``hand_over_ns`` after that action's published end."""

    step: int
    slot: int
    rank: int
    stage: int
    kind: ActionKind
    microbatch: int
    hand_over_ns: int


class PeerBoard:
    """The rank's end: publishes each action's start and expected end, never blocks or
    raises (``errors`` counts what failed)."""

    def __init__(self, path: Path, mm: mmap.mmap) -> None:
        self.path = path
        self._mm = mm
        self._n = 0  # action starts published
        self._waits = 0  # awaiting records written
        self.errors = 0

    @classmethod
    def create(cls, path: str | os.PathLike[str]) -> PeerBoard:
        """A new board at ``path`` (a previous run's, if any, is replaced): it appears whole,
        header first, so a reader never maps a half-made one."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
        with os.fdopen(create_file(tmp), "wb") as f:
            f.write(_HEADER.pack(_MAGIC, _VERSION, ENTRIES).ljust(FILE_BYTES, b"\0"))
        os.replace(tmp, path)
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            mm = mmap.mmap(fd, FILE_BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return cls(path, mm)

    def publish(
        self, step: int, stage: int, kind: ActionKind, microbatch: int, start_ns: int, end_ns: int
    ) -> None:
        """The rank began ``kind`` of ``microbatch`` on ``stage`` at ``start_ns`` and expects
        to end it at ``end_ns`` (run clock)."""
        try:
            n = self._n
            at = _RING + (n % ENTRIES) * _ENTRY.size
            fields = (step, stage, _KIND_CODES[kind], microbatch, 0, start_ns, end_ns)
            self._write(_ENTRY, at, 2 * (n + 1), fields)
            self._n = n + 1
        except Exception:
            self._failed("a start was not published")

    def awaiting(
        self,
        step: int,
        slot: int,
        rank: int,
        stage: int,
        kind: ActionKind,
        microbatch: int,
        hand_over_ns: int,
    ) -> None:
        """The rank's bubble (``step``, ``slot``) waits for ``rank``'s ``kind`` of
        ``microbatch`` on ``stage`` (see ``Awaiting``); it replaces the last such record."""
        try:
            n = self._waits
            fields = (step, slot, rank, stage, _KIND_CODES[kind], microbatch, 0, hand_over_ns)
            self._write(_AWAITING, _HEADER.size, 2 * (n + 1), fields)
            self._waits = n + 1
        except Exception:
            self._failed("a bubble's awaited action was not published")

    def _write(self, record: struct.Struct, at: int, seq: int, fields: tuple[int, ...]) -> None:
        """One seqlocked record: odd while it is written, ``seq`` (even) once whole."""
        mm = self._mm
        struct.pack_into("<Q", mm, at, seq - 1)
        record.pack_into(mm, at, seq - 1, *fields)
        struct.pack_into("<Q", mm, at, seq)

    def _failed(self, what: str) -> None:
        self.errors += 1
        if self.errors == 1:
            log.exception("action board %s: %s", self.path, what)

    def close(self) -> None:
        """Unmap the board (its file stays for the run's readers). Idempotent."""
        self._mm.close()


class PeerBoards:
    """The boards of a run's ranks, mapped read-only as they appear."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self._maps: dict[int, mmap.mmap] = {}
        self._looked: dict[int, float] = {}  # rank -> when its board was last looked for

    def end_of(
        self, rank: int, step: int, stage: int, kind: ActionKind, microbatch: int
    ) -> int | None:
        """The end ``rank`` published for its action (``step``, ``stage``, ``kind``,
        ``microbatch``), if it has started it and still keeps it; a backward matches B or I.
        None otherwise, or while its board cannot be read."""
        mm = self._map(rank)
        if mm is None:
            return None
        codes = _BACKWARD if _KIND_CODES[kind] in _BACKWARD else {_KIND_CODES[kind]}
        for i in range(ENTRIES):
            at = _RING + i * _ENTRY.size
            seq, e_step, e_stage, e_kind, e_mb, _, _, e_end = _ENTRY.unpack_from(mm, at)
            if seq == 0 or seq & 1:
                continue  # empty, or being written
            if (e_step, e_stage, e_mb) != (step, stage, microbatch) or e_kind not in codes:
                continue
            if struct.unpack_from("<Q", mm, at)[0] != seq:
                continue  # rewritten while it was read
            return int(e_end)
        return None

    def awaiting(self, rank: int) -> Awaiting | None:
        """What ``rank``'s latest bubble that waited on an action not yet started waits for;
        None if it has written none, while it writes one, or while its board cannot be read
        (or holds a kind no action has)."""
        mm = self._map(rank)
        if mm is None:
            return None
        seq, step, slot, feeder, stage, code, mb, _, hand_over = _AWAITING.unpack_from(
            mm, _HEADER.size
        )
        if seq == 0 or seq & 1 or code not in _KINDS:
            return None
        if struct.unpack_from("<Q", mm, _HEADER.size)[0] != seq:
            return None  # rewritten while it was read
        return Awaiting(step, slot, feeder, stage, _KINDS[code], mb, hand_over)

    def _map(self, rank: int) -> mmap.mmap | None:
        mm = self._maps.get(rank)
        if mm is not None:
            return mm
        now = time.monotonic()
        if now - self._looked.get(rank, -_REOPEN_S) < _REOPEN_S:
            return None
        self._looked[rank] = now
        path = peer_board_path(self.run_dir, rank)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None  # not there yet: the rank has not started
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or st.st_size < FILE_BYTES:
                return None
            mm = mmap.mmap(fd, FILE_BYTES, mmap.MAP_SHARED, mmap.PROT_READ)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        if _HEADER.unpack_from(mm, 0) != (_MAGIC, _VERSION, ENTRIES):
            mm.close()
            return None
        self._maps[rank] = mm
        return mm

    def close(self) -> None:
        """Unmap every board. Idempotent."""
        maps, self._maps = self._maps, {}
        for mm in maps.values():
            mm.close()


class AwaitedPeers:
    """A rank's side of the run's boards: it publishes its own action starts and reads, for
    an action it is about to wait for, the end the neighbour that feeds it published.

    Args:
        run_dir: the run directory (boards live in its ``edges/``).
        rank: this rank.
        stage_ranks: every global stage index of the pipeline -> the rank that runs it.
    """

    def __init__(
        self, run_dir: str | os.PathLike[str], rank: int, stage_ranks: dict[int, int]
    ) -> None:
        self.rank = rank
        self.stage_ranks = dict(stage_ranks)
        self.board = PeerBoard.create(peer_board_path(run_dir, rank))
        self.boards = PeerBoards(run_dir)

    def publish(
        self, step: int, stage: int, kind: ActionKind, microbatch: int, start_ns: int, end_ns: int
    ) -> None:
        """This rank began an action (``PeerBoard.publish``)."""
        self.board.publish(step, stage, kind, microbatch, start_ns, end_ns)

    def feeder(self, stage: int, kind: ActionKind) -> tuple[int, int] | None:
        """(rank, stage) of the action whose output this rank's ``kind`` on ``stage`` waits
        for: a forward's input comes from the stage before, a backward's gradient from the
        stage after. None for an action fed by no other rank (the first stage's forward, the
        last's backward, a W, a neighbour stage on this rank)."""
        source = feeding_stage(stage, kind)
        rank = None if source is None else self.stage_ranks.get(source)
        return None if source is None or rank is None or rank == self.rank else (rank, source)

    def awaited_end(self, step: int, stage: int, kind: ActionKind, microbatch: int) -> int | None:
        """The end another rank published for the action this rank's ``kind`` of
        ``microbatch`` on ``stage`` waits for (``feeder``); None where no other rank feeds it
        or its feeder has not published it."""
        fed = self.feeder(stage, kind)
        return None if fed is None else self.boards.end_of(fed[0], step, fed[1], kind, microbatch)

    def awaiting(
        self, step: int, slot: int, stage: int, kind: ActionKind, microbatch: int, hand_over_ns: int
    ) -> None:
        """This rank's bubble (``step``, ``slot``) waits for the action that feeds its
        ``kind`` of ``microbatch`` on ``stage``, not started yet: say so on its board, with
        the hand-over it adds to a feeder's end (``PeerBoard.awaiting``)."""
        fed = self.feeder(stage, kind)
        if fed is not None:
            self.board.awaiting(step, slot, fed[0], fed[1], kind, microbatch, hand_over_ns)

    def close(self) -> None:
        """Unmap this rank's board and its neighbours'. Idempotent."""
        self.board.close()
        self.boards.close()
