"""Claims about the action boards through which ranks publish when their actions end."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from freeride_lab.core.schedule import ActionKind
from freeride_lab.io import peer_board
from freeride_lab.io.peer_board import (
    ENTRIES,
    AwaitedPeers,
    PeerBoard,
    PeerBoards,
    peer_board_path,
)

F, B, W = ActionKind.FORWARD, ActionKind.BACKWARD, ActionKind.BACKWARD_WEIGHT
INPUT = ActionKind.BACKWARD_INPUT


def test_a_neighbour_reads_the_end_a_rank_published_for_an_action(tmp_path: Path) -> None:
    board = PeerBoard.create(peer_board_path(tmp_path, 1))
    board.publish(7, 1, F, 3, 1_000, 5_000)
    boards = PeerBoards(tmp_path)
    assert boards.end_of(1, 7, 1, F, 3) == 5_000
    assert boards.end_of(1, 7, 1, F, 2) is None  # not started
    assert boards.end_of(1, 6, 1, F, 3) is None  # another step's
    assert boards.end_of(1, 7, 1, B, 3) is None  # another kind


def test_a_backward_is_found_whether_it_ran_whole_or_as_its_input_half(tmp_path: Path) -> None:
    board = PeerBoard.create(peer_board_path(tmp_path, 2))
    board.publish(0, 2, INPUT, 1, 0, 10)
    board.publish(0, 2, W, 1, 10, 20)
    assert PeerBoards(tmp_path).end_of(2, 0, 2, B, 1) == 10


def test_the_board_keeps_the_last_entries_starts(tmp_path: Path) -> None:
    board = PeerBoard.create(peer_board_path(tmp_path, 0))
    for mb in range(ENTRIES + 3):
        board.publish(0, 0, F, mb, mb, 100 + mb)
    boards = PeerBoards(tmp_path)
    assert [boards.end_of(0, 0, 0, F, mb) for mb in (2, 3, ENTRIES + 2)] == [
        None,
        103,
        ENTRIES + 102,
    ]


def test_an_entry_being_written_is_not_read(tmp_path: Path) -> None:
    board = PeerBoard.create(peer_board_path(tmp_path, 0))
    board.publish(0, 0, F, 0, 0, 10)
    mm = board._mm
    struct.pack_into("<Q", mm, peer_board._RING, 1)  # odd: torn
    assert PeerBoards(tmp_path).end_of(0, 0, 0, F, 0) is None


def test_a_missing_board_is_looked_for_again_only_after_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr(peer_board.time, "monotonic", lambda: now[0])
    boards = PeerBoards(tmp_path)
    assert boards.end_of(3, 0, 3, B, 0) is None  # the rank has not started
    PeerBoard.create(peer_board_path(tmp_path, 3)).publish(0, 3, B, 0, 0, 10)
    assert boards.end_of(3, 0, 3, B, 0) is None  # looked for a moment ago
    now[0] += 1.5
    assert boards.end_of(3, 0, 3, B, 0) == 10


@pytest.mark.parametrize(
    "content",
    [b"", b"\0" * 16, b"NOTABORD" + bytes(peer_board.FILE_BYTES), b"x" * peer_board.FILE_BYTES],
)
def test_a_damaged_board_reads_as_no_end_never_an_error(tmp_path: Path, content: bytes) -> None:
    path = peer_board_path(tmp_path, 1)
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    assert PeerBoards(tmp_path).end_of(1, 0, 1, F, 0) is None


def test_a_board_behind_a_symlink_is_not_followed(tmp_path: Path) -> None:
    real = PeerBoard.create(tmp_path / "elsewhere.actions")
    real.publish(0, 1, F, 0, 0, 10)
    link = peer_board_path(tmp_path, 1)
    link.parent.mkdir(parents=True)
    os.symlink(tmp_path / "elsewhere.actions", link)
    assert PeerBoards(tmp_path).end_of(1, 0, 1, F, 0) is None


def test_a_board_is_private_and_replaces_a_previous_runs(tmp_path: Path) -> None:
    path = peer_board_path(tmp_path, 0)
    PeerBoard.create(path).publish(0, 0, F, 0, 0, 10)
    PeerBoard.create(path)
    assert PeerBoards(tmp_path).end_of(0, 0, 0, F, 0) is None
    assert path.stat().st_mode & 0o077 == 0


def test_a_publish_that_fails_is_counted_never_raised(tmp_path: Path) -> None:
    board = PeerBoard.create(peer_board_path(tmp_path, 0))
    board.close()
    board.publish(0, 0, F, 0, 0, 10)
    assert board.errors == 1


@pytest.mark.parametrize(
    ("stage", "kind", "source"),
    [(1, F, 0), (1, B, 2), (1, INPUT, 2), (0, F, None), (3, B, None), (1, W, None)],
)
def test_a_rank_waits_on_the_stage_before_for_a_forward_and_after_for_a_backward(
    tmp_path: Path, stage: int, kind: ActionKind, source: int | None
) -> None:
    stage_ranks = {0: 0, 1: 1, 2: 2, 3: 3}
    for rank in (0, 2, 3):
        feeder = AwaitedPeers(tmp_path, rank, stage_ranks)
        for k in (F, B):
            feeder.publish(0, rank, k, 0, 0, 100 + rank)
    me = AwaitedPeers(tmp_path, 1, stage_ranks)
    want = None if source is None else 100 + source
    assert me.awaited_end(0, stage, kind, 0) == want


def test_a_stage_fed_by_another_stage_of_the_same_rank_waits_on_no_board(tmp_path: Path) -> None:
    v_shape = {0: 0, 1: 1, 2: 1, 3: 0}  # rank 1 holds stages 1 and 2
    me = AwaitedPeers(tmp_path, 1, v_shape)
    me.publish(0, 1, F, 0, 0, 10)
    assert me.awaited_end(0, 2, F, 0) is None
    assert me.awaited_end(0, 1, B, 0) is None  # stage 2 is this rank's too


def test_a_bubble_waiting_on_an_action_not_started_names_it_and_its_hand_over(
    tmp_path: Path,
) -> None:
    stage_ranks = {0: 0, 1: 1, 2: 2}
    me = AwaitedPeers(tmp_path, 1, stage_ranks)
    boards = PeerBoards(tmp_path)
    assert boards.awaiting(1) is None  # none written yet
    me.awaiting(4, 3, 1, B, 2, hand_over_ns=-300)  # its B of micro-batch 2: fed by stage 2
    assert boards.awaiting(1) == peer_board.Awaiting(4, 3, 2, 2, B, 2, -300)
    me.awaiting(4, 5, 1, F, 3, hand_over_ns=200)
    assert boards.awaiting(1) == peer_board.Awaiting(4, 5, 0, 0, F, 3, 200)
    me.awaiting(4, 6, 1, W, 3, hand_over_ns=0)  # a W waits on no other rank: unchanged
    assert boards.awaiting(1) == peer_board.Awaiting(4, 5, 0, 0, F, 3, 200)


def test_an_awaiting_record_being_written_or_with_no_kind_is_not_read(tmp_path: Path) -> None:
    board = PeerBoard.create(peer_board_path(tmp_path, 0))
    board.awaiting(0, 1, 1, 1, F, 0, 0)
    struct.pack_into("<Q", board._mm, peer_board._HEADER.size, 3)  # odd: torn
    assert PeerBoards(tmp_path).awaiting(0) is None
    board.awaiting(0, 1, 1, 1, F, 0, 0)
    struct.pack_into("<i", board._mm, peer_board._HEADER.size + 8 + 8 + 12, 99)  # no kind
    assert PeerBoards(tmp_path).awaiting(0) is None
