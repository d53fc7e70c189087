"""Claims about events → tables and the incremental tailer (files and bus batches, pure data)."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from typing import Any

import pandas as pd
import psutil
import pytest

from freeride_lab.core.events import (
    ActionTimed,
    BubbleEdge,
    Event,
    MemoryReport,
    RankStarted,
    SideTaskStateChanged,
    SideTaskStep,
    StepTimed,
    to_json,
)
from freeride_lab.io.bus import BusBatch
from freeride_lab.io.rundir import RunDir
from freeride_lab.lab.tables import (
    ACTION_COLUMNS,
    MEMORY_COLUMNS,
    SIDE_TASK_STEP_COLUMNS,
    STEP_COLUMNS,
    EventTables,
    EventTailer,
    actions_frame,
    events_frame,
    memory_frame,
    side_task_steps_frame,
    steps_frame,
)


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


STEP_MARKS = ("start_ns", "end_ns", "optimizer_start_ns", "optimizer_end_ns")


def step_timed(
    rank: int, marks_ns: tuple[int, int, int, int], *, step: int = 0, **fields: Any
) -> StepTimed:
    """A step of ``rank`` whose window start, window end, optimizer start and optimizer end are
    ``marks_ns``; ``fields`` set the rest (loss, tokens)."""
    marks = dict(zip(STEP_MARKS, marks_ns, strict=True))
    return StepTimed(rank=rank, step=step, **marks, **fields)


def lines(*events: Event) -> bytes:
    return b"".join(to_json(e).encode() + b"\n" for e in events)


def as_dicts(*events: Event) -> list[dict[str, Any]]:
    return [json.loads(to_json(e)) for e in events]


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
    step = step_timed(0, (0, 10_000_000, 10_000_000, 13_000_000), loss=None, tokens=64)
    frame = steps_frame(as_dicts(step), t0_ns=0)
    assert frame.loc[0, "optimizer_ms"] == 3.0
    assert pd.isna(frame.loc[0, "loss"])
    assert frame.loc[0, "tokens"] == 64


def test_steps_frame_places_the_optimizer_on_the_actions_clock() -> None:
    step = step_timed(1, (2_000_000, 10_000_000, 10_500_000, 13_000_000))
    tables = EventTables()
    tables.add(as_dicts(started(1, 1_000_000), step))
    row = tables.steps().iloc[0]
    assert (row["optimizer_start_ms"], row["optimizer_end_ms"]) == (9.5, 12.0)


def test_steps_done_counts_steps_that_every_rank_completed() -> None:
    tables = EventTables()
    tables.add(
        [{"kind": "step", "rank": 0, "step": s} for s in range(3)]
        + [{"kind": "step", "rank": 1, "step": 0}]
    )
    assert tables.steps_done(world_size=2) == 1
    assert tables.steps_done(world_size=3) == 0


def mixed_run(steps: int) -> list[dict[str, Any]]:
    """Events of a 2-rank run with a side task, in the order a poll might hand them out."""
    out: list[Event] = [started(0, 1_000), started(1, 2_000)]
    t = 10_000_000
    for step in range(steps):
        for rank in (1, 0):  # later ranks first: the tables sort, not the arrival order
            for mb in range(2):
                out.append(action(mb, t + mb * 5_000_000, rank=rank, step=step))
                out.append(
                    BubbleEdge(rank=rank, stage=rank, step=step, slot=mb, edge="end", t_ns=t)
                )
            out.append(
                step_timed(
                    rank,
                    (t, t + 9_000_000, t + 9_000_000, t + 9_500_000),
                    step=step,
                    loss=1.5 if rank == 1 else None,
                    tokens=16,
                )
            )
            out.append(
                MemoryReport(
                    rank=rank,
                    step=step,
                    peak_reserved_bytes=100 + step,
                    capacity_bytes=0 if rank else 1_000,
                    device="cpu",
                )
            )
        out.append(
            SideTaskStep(
                task_id=f"t-{step % 3}",
                name="Counting",
                stage=0,
                rank=0,
                step=step,
                start_ns=t + 3,
                end_ns=t + 2_000_003,
                progress=1.0,
                unit="iterations",
                overrun_ns=step % 2,
            )
        )
        out.append(SideTaskStateChanged(task_id="t-0", name="C", stage=0, state="RUNNING", t_ns=t))
        t += 20_000_000
    return as_dicts(*out)


def test_tables_equal_the_frames_of_every_event_across_packs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("freeride_lab.lab.tables._Columns.PACK_ROWS", 7)
    monkeypatch.setattr("freeride_lab.lab.tables._EventLog.PACK_EVENTS", 11)
    events = mixed_run(steps=40)
    tables = EventTables()
    for i in range(0, len(events), 13):  # polls of uneven size; build between some of them
        tables.add(json.loads(json.dumps(events[i : i + 13])))
        if i % 39 == 0:
            tables.actions(), tables.side_task_steps()
    t0 = tables.t0()
    assert t0 == 1_000
    pd.testing.assert_frame_equal(tables.actions(), actions_frame(events, t0))
    pd.testing.assert_frame_equal(tables.steps(), steps_frame(events, t0))
    pd.testing.assert_frame_equal(tables.memory(), memory_frame(events))
    pd.testing.assert_frame_equal(tables.side_task_steps(), side_task_steps_frame(events, t0))
    pd.testing.assert_frame_equal(tables.frame(), events_frame(events, t0))


def test_events_since_gives_the_events_from_an_index_across_packs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("freeride_lab.lab.tables._EventLog.PACK_EVENTS", 5)
    events = mixed_run(steps=6)
    tables = EventTables()
    tables.add(json.loads(json.dumps(events)))
    assert len(tables) == len(events)
    for start in (0, 3, 5, 12, len(events) - 1, len(events), len(events) + 4):
        assert tables.events_since(start) == events[start:]


def test_each_read_is_a_frame_of_its_own_with_every_row_so_far() -> None:
    tables = EventTables()
    tables.add(mixed_run(steps=3))
    first = tables.actions()
    first.loc[:, "rank"] = 99  # a caller changing its frame changes nothing for the next one
    again = tables.actions()
    assert (again["rank"] != 99).all() and len(again) == len(first)
    tables.add(as_dicts(action(9, 999_000_000)))
    assert len(tables.actions()) == len(first) + 1


def side_task_step_event(i: int) -> dict[str, object]:
    t = 10**18 + i * 1_000_000
    return {"kind": "side_task_step", "task_id": "counting-1a2b", "name": "Counting",
            "stage": 0, "rank": 0, "step": i // 10, "start_ns": t, "end_ns": t + 500_000,
            "progress": 1.0, "unit": "steps", "overrun_ns": 0}  # fmt: skip


def test_a_side_task_step_says_when_its_host_saw_the_edge_only_where_it_did() -> None:
    first = {**side_task_step_event(0), "seen_ns": 10**18 - 250_000,  # 0.25 ms before its start
             "expected_ns": 10**18 - 400_000, "spin_from_ns": 10**18 - 700_000,
             "spin_until_ns": 10**18 - 200_000, "guard_ns": 3_000_000}  # fmt: skip
    later = side_task_step_event(1)  # files written before hosts said so lack the fields
    tables = EventTables()
    tables.add([first, later])
    frame = tables.side_task_steps()
    start = frame["start_ms"].iloc[0]
    assert frame["seen_ms"].iloc[0] == pytest.approx(start - 0.25)
    assert frame["expected_ms"].iloc[0] == pytest.approx(start - 0.4)
    assert frame["spin_from_ms"].iloc[0] == pytest.approx(start - 0.7)
    assert frame["spin_until_ms"].iloc[0] == pytest.approx(start - 0.2)
    assert frame["guard_ms"].iloc[0] == pytest.approx(3.0)  # a duration, not a time
    for name in ("seen_ms", "expected_ms", "spin_from_ms", "spin_until_ms", "guard_ms"):
        assert math.isnan(frame[name].iloc[1])
    pd.testing.assert_frame_equal(frame, side_task_steps_frame([first, later], tables.t0()))


@pytest.mark.slow  # a million rows written and read back
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RSS as Linux reports it")
def test_rereading_a_growing_table_keeps_memory_near_the_packed_rows() -> None:
    # A dashboard rebuilds side_task_steps every tick while rows keep coming. Frames are not
    # kept and freed memory goes back to the OS, so RSS grows by the packed row plus the last
    # dropped frame: ~120 B a row here; keeping frames, with the allocators holding on to freed
    # memory, cost ~440 B.
    tables = EventTables()
    me = psutil.Process()
    rows, rss = 0, []
    for batch in range(250):
        tables.add([side_task_step_event(rows + i) for i in range(1000)])
        rows += 1000
        assert len(tables.side_task_steps()) == rows
        if batch in (49, 249):
            rss.append(me.memory_info().rss)
    per_row = (rss[1] - rss[0]) / 200_000
    assert per_row < 200, f"RSS grew {per_row:.0f} B per side-task step row"


def test_an_event_missing_a_column_is_left_out_of_its_table_and_counted() -> None:
    tables = EventTables()
    tables.add([*as_dicts(action(0, 10)), {"kind": "action", "rank": 0, "step": 1}])
    assert len(tables.actions()) == 1
    assert tables.bad_rows == 1
    assert len(tables) == 2  # still in the all-events log


def test_the_packed_store_keeps_tens_of_bytes_per_event() -> None:
    events = mixed_run(steps=600)  # ~ 9,600 events: several packs of each kind
    tables = EventTables()
    tables.add(events)
    assert tables.nbytes() / len(events) < 100
