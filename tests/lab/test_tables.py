"""Claims about events → tables and the incremental tailer (files and bus batches, pure data)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from freeride_lab.core.events import ActionTimed, Event, RankStarted, StepTimed, to_json
from freeride_lab.lab.tables import (
    ACTION_COLUMNS,
    MEMORY_COLUMNS,
    SIDE_TASK_STEP_COLUMNS,
    STEP_COLUMNS,
    EventTables,
    EventTailer,
    actions_frame,
    memory_frame,
    side_task_steps_frame,
    steps_frame,
)
from freeride_lab.runtime.bus import BusBatch
from freeride_lab.runtime.rundir import RunDir


def action(mb: int, start_ns: int, *, rank: int = 0, step: int = 0, kind: str = "F") -> ActionTimed:
    end_ns = start_ns + 2_000_000
    return ActionTimed(
        rank=rank,
        stage=rank,
        step=step,
        action=kind,
        microbatch=mb,
        start_ns=start_ns,
        end_ns=end_ns,
    )


def started(rank: int, t_ns: int) -> RankStarted:
    return RankStarted(
        rank=rank, world_size=2, stages=(rank,), pid=1, host="h", device="cpu", t_ns=t_ns
    )


def lines(*events: Event) -> bytes:
    return b"".join(to_json(e).encode() + b"\n" for e in events)


def as_dicts(*events: Event) -> list[dict[str, Any]]:
    return [json.loads(to_json(e)) for e in events]


@pytest.fixture
def run_dir(tmp_path: Path) -> RunDir:
    rd = RunDir(tmp_path / "run")
    rd.create()
    return rd


def test_tailer_leaves_a_partial_last_line_for_the_next_poll(run_dir: RunDir) -> None:
    whole = lines(action(0, 10), action(1, 20))
    cut = whole.index(b"\n") + 5
    path = run_dir.rank_events(0)
    path.write_bytes(whole[:cut])
    tailer = EventTailer(run_dir)
    assert [e["microbatch"] for e in tailer.poll()] == [0]
    with open(path, "ab") as f:
        f.write(whole[cut:])
    assert [e["microbatch"] for e in tailer.poll()] == [1]
    assert tailer.poll() == []


def test_feed_skips_what_was_already_read_from_the_file(run_dir: RunDir) -> None:
    data = lines(action(0, 10), action(1, 20))
    run_dir.rank_events(0).write_bytes(data)
    tailer = EventTailer(run_dir)
    assert len(tailer.poll()) == 2
    assert tailer.feed(BusBatch("rank-0.jsonl", 0, data)) == []


def test_feed_after_a_dropped_batch_reads_the_gap_from_the_file(run_dir: RunDir) -> None:
    first, second = lines(action(0, 10)), lines(action(1, 20))
    run_dir.rank_events(0).write_bytes(first + second)
    tailer = EventTailer(run_dir)
    got = tailer.feed(BusBatch("rank-0.jsonl", len(first), second))  # the first batch was lost
    assert [e["microbatch"] for e in got] == [0, 1]
    assert tailer.poll() == []


def test_feed_accepts_a_batch_whose_file_is_on_another_node(run_dir: RunDir) -> None:
    data = lines(action(0, 10, rank=3))
    tailer = EventTailer(run_dir)
    got = tailer.feed(BusBatch("rank-3.jsonl", 100, data))
    assert [e["rank"] for e in got] == [3]
    assert tailer.missing_bytes == 100


def test_a_line_that_is_not_json_is_skipped_and_counted(run_dir: RunDir) -> None:
    run_dir.rank_events(0).write_bytes(b"not json\n" + lines(action(0, 10)))
    tailer = EventTailer(run_dir)
    assert len(tailer.poll()) == 1
    assert tailer.bad_lines == 1


@pytest.mark.parametrize(
    ("build", "columns"),
    [
        (actions_frame, ACTION_COLUMNS),
        (steps_frame, STEP_COLUMNS),
        (memory_frame, MEMORY_COLUMNS),
        (side_task_steps_frame, SIDE_TASK_STEP_COLUMNS),
    ],
)
def test_frames_of_no_events_keep_their_columns_and_dtypes(
    build: Callable[[list[dict[str, Any]]], pd.DataFrame], columns: tuple[str, ...]
) -> None:
    empty = build([])
    assert tuple(empty.columns) == columns
    both = pd.concat([empty, empty])
    assert (both.dtypes == empty.dtypes).all()


def test_action_times_are_ms_from_the_earliest_rank_start() -> None:
    tables = EventTables()
    tables.add(as_dicts(started(1, 5_000_000), started(0, 1_000_000), action(0, 3_000_000)))
    row = tables.actions().iloc[0]
    assert (row["start_ms"], row["end_ms"], row["duration_ms"]) == (2.0, 4.0, 2.0)
    assert tuple(tables.actions().columns) == ACTION_COLUMNS


def test_steps_frame_has_optimizer_ms_and_nan_loss_off_the_last_stage() -> None:
    step = StepTimed(
        rank=0,
        step=0,
        start_ns=0,
        end_ns=10_000_000,
        optimizer_start_ns=10_000_000,
        optimizer_end_ns=13_000_000,
        loss=None,
        tokens=64,
    )
    frame = steps_frame(as_dicts(step), t0_ns=0)
    assert frame.loc[0, "optimizer_ms"] == 3.0
    assert pd.isna(frame.loc[0, "loss"])
    assert frame.loc[0, "tokens"] == 64


def test_steps_done_counts_steps_that_every_rank_completed() -> None:
    tables = EventTables()
    tables.add(
        [{"kind": "step", "rank": 0, "step": s} for s in range(3)]
        + [{"kind": "step", "rank": 1, "step": 0}]
    )
    assert tables.steps_done(world_size=2) == 1
    assert tables.steps_done(world_size=3) == 0
