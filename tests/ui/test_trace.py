"""Per-rank Chrome traces: valid JSON, one X event per span, and a real run's traces load in
Holistic Trace Analysis with the right ranks and the idle time of our bubble table."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from runs import synthetic_config
from waits import run_processes

from freeride_lab.core.bubbles import BUBBLE_COLUMNS
from freeride_lab.lab.session import Session
from freeride_lab.lab.tables import SIDE_TASK_STEP_COLUMNS
from freeride_lab.ui.trace import (
    BUBBLE_TID,
    COMPUTE_STREAM,
    KERNEL_CAT,
    OPTIMIZER_TID,
    SIDE_TASK_TID,
    write_traces,
)

STARTUP_S = 240.0  # a fresh run on a loaded two-core box (a torch import per process)

ACTIONS = pd.DataFrame(
    [
        (0, 0, 0, "F", 0, 0.0, 1.5, 1.5),
        (0, 0, 0, "B", 0, 4.0, 6.0, 2.0),
        (0, 1, 1, "F", 0, 1.5, 3.0, 1.5),
        (0, 1, 1, "B", 0, 3.0, 4.0, 1.0),
    ],
    columns=["step", "rank", "stage", "action", "microbatch", "start_ms", "end_ms", "duration_ms"],
)
BUBBLES = pd.DataFrame(
    [
        (0, 0, 0, 0, 1.5, 4.0, 2.5, "steady", "A", "0B0", "0F0"),
        (0, 1, 1, 0, 0.0, 1.5, 1.5, "warmup", None, "1F0", ""),
    ],
    columns=list(BUBBLE_COLUMNS),
)
SIDE = pd.DataFrame(
    [("t1", "resnet18", 0, 0, 0, 1.6, 3.6, 2.0, 32.0, "samples", 0.0, *[float("nan")] * 5)],
    columns=list(SIDE_TASK_STEP_COLUMNS),
)


def spans(doc):
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


@pytest.fixture
def docs(tmp_path):
    paths = write_traces(ACTIONS, BUBBLES, SIDE, tmp_path / "trace", world_size=3)
    return paths, [json.loads(p.read_text()) for p in paths]


def test_one_file_per_rank_named_rank_r(docs):
    paths, _ = docs
    assert [p.name for p in paths] == ["rank-0.json", "rank-1.json", "rank-2.json"]


def test_distributed_info_carries_rank_and_world_size(docs):
    _, parsed = docs
    assert [d["distributedInfo"] for d in parsed] == [
        {"rank": r, "world_size": 3} for r in range(3)
    ]


def test_span_counts_per_rank(docs):
    _, parsed = docs
    assert [len(spans(d)) for d in parsed] == [4, 3, 0]  # rank 0: 2 actions + bubble + side step


def test_spans_use_rank_as_pid_and_microseconds(docs):
    _, parsed = docs
    backward = next(e for e in spans(parsed[0]) if e["name"] == "0B0")
    assert (backward["pid"], backward["tid"], backward["ts"], backward["dur"]) == (
        0,
        0,
        4000.0,
        2000.0,
    )


def test_names_for_bubbles_and_side_tasks(docs):
    _, parsed = docs
    by_name = {e["name"]: e for e in spans(parsed[0])}
    assert by_name["bubble A"]["tid"] == BUBBLE_TID
    assert by_name["resnet18 step"]["tid"] == SIDE_TASK_TID
    assert by_name["resnet18 step"]["args"]["progress"] == 32.0
    assert {e["name"] for e in spans(parsed[1])} == {"1F0", "1B0", "bubble warmup"}


def test_missing_label_becomes_null_in_args(docs):
    _, parsed = docs
    bubble = next(e for e in spans(parsed[1]) if e["cat"] == "bubble")
    assert bubble["args"]["label"] is None


def test_threads_are_named_for_perfetto(docs):
    _, parsed = docs
    names = {
        e["tid"]: e["args"]["name"] for e in parsed[0]["traceEvents"] if e["name"] == "thread_name"
    }
    assert names == {0: "stage 0", BUBBLE_TID: "bubbles", SIDE_TASK_TID: "side task resnet18"}


def test_unfinished_spans_are_left_out(tmp_path):
    actions = pd.concat(
        [ACTIONS, ACTIONS.iloc[:1].assign(end_ms=float("nan"), duration_ms=float("nan"))]
    )
    [doc_path, _] = write_traces(actions, BUBBLES, None, tmp_path, world_size=2)
    assert len(spans(json.loads(doc_path.read_text()))) == 3


def test_rank_outside_world_size_is_rejected(tmp_path):
    with pytest.raises(ValueError, match=r"ranks \[1\] but world_size=1"):
        write_traces(ACTIONS, BUBBLES, SIDE, tmp_path, world_size=1)


STEPS = pd.DataFrame(
    {
        "step": [0, 0],
        "rank": [0, 1],
        "optimizer_start_ms": [6.0, 4.0],
        "optimizer_end_ms": [6.5, float("nan")],
    }
)


def test_busy_spans_are_kernels_on_the_compute_stream_and_bubbles_are_not(tmp_path):
    paths = write_traces(ACTIONS, BUBBLES, SIDE, tmp_path, world_size=2, steps=STEPS)
    rank0 = spans(json.loads(paths[0].read_text()))
    busy = [e for e in rank0 if e["cat"] == KERNEL_CAT]
    assert sorted(e["name"] for e in busy) == ["0B0", "0F0", "optimizer"]
    assert {e["args"]["stream"] for e in busy} == {COMPUTE_STREAM}
    assert all("stream" not in e["args"] for e in rank0 if e["cat"] != KERNEL_CAT)


def test_optimizer_spans_come_from_the_steps_table(tmp_path):
    paths = write_traces(ACTIONS, BUBBLES, None, tmp_path, world_size=2, steps=STEPS)
    [rank0, rank1] = [spans(json.loads(p.read_text())) for p in paths]
    optimizer = [e for e in rank0 if e["name"] == "optimizer"]
    assert [(e["tid"], e["ts"], e["dur"]) for e in optimizer] == [(OPTIMIZER_TID, 6000.0, 500.0)]
    assert not [e for e in rank1 if e["name"] == "optimizer"]  # its end is unknown


# -- a real run, read by Holistic Trace Analysis -------------------------------------------------


@pytest.fixture(scope="module")
def real_traces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Session, Path]]:
    """A finished two-rank CPU run and the trace directory of its report."""
    config = synthetic_config(steps=12, phase_ms=5.0)
    out = tmp_path_factory.mktemp("hta")
    with Session.launch(config, run_dir=out / "run", grace_s=3) as session:
        session.wait(timeout_s=STARTUP_S)
        report = session.report(out / "report" / "report.html")
        yield session, report.parent / "trace"
    assert not run_processes(out / "run")


def test_hta_reads_each_rank_of_a_real_run(real_traces):
    from hta.trace_analysis import TraceAnalysis

    _, trace_dir = real_traces
    analysis = TraceAnalysis(trace_dir=str(trace_dir))
    assert analysis.t.get_ranks() == [0, 1]


def test_hta_idle_time_per_rank_matches_the_bubble_table(real_traces):
    """HTA's idle = gaps between busy spans; ours = the bubble table (which also counts the
    rank's idle before its first and after its last span: a few ms of a whole run)."""
    from hta.trace_analysis import TraceAnalysis

    session, trace_dir = real_traces
    analysis = TraceAnalysis(trace_dir=str(trace_dir))
    temporal = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
    idle, _ = analysis.get_idle_time_breakdown(ranks=[0, 1], visualize=False)
    ours_us = session.bubbles.groupby("rank")["duration_ms"].sum() * 1000.0
    hta_us = temporal["idle_time(us)"].astype(float)
    assert (hta_us > 0).all()
    assert list(hta_us.index) == [0, 1]
    for rank in (0, 1):
        assert hta_us[rank] == pytest.approx(ours_us[rank], rel=0.10), rank
        per_stream = idle[idle["rank"] == rank]
        assert per_stream["idle_time"].sum() == pytest.approx(hta_us[rank], rel=1e-6)
