"""Per-rank Chrome traces: valid JSON, one X event per span, HTA's distributedInfo.rank."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from freeride_lab.core.bubbles import BUBBLE_COLUMNS
from freeride_lab.ui.trace import BUBBLE_TID, SIDE_TASK_TID, write_traces

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
    [("t1", "resnet18", 0, 0, 0, 1.6, 3.6, 2.0, 32.0, "samples", 0.0)],
    columns=[
        "task_id",
        "name",
        "stage",
        "rank",
        "step",
        "start_ms",
        "end_ms",
        "duration_ms",
        "progress",
        "unit",
        "overrun_ms",
    ],
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
