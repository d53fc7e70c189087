"""benchmarks/bench_step_sizes.py: step sizes against one slice a step, over recorded bubbles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_scripts import load_script

bench_step_sizes = load_script("bench_step_sizes")


def test_bubbles_are_read_from_a_ranks_edges_with_their_predicted_and_real_lengths(
    tmp_path: Path,
) -> None:
    events = tmp_path / "events"
    events.mkdir()
    ms = 1_000_000
    lines = [
        {"kind": "bubble_edge", "step": 1, "slot": 0, "edge": "start", "t_ns": 0,
         "predicted_end_ns": 20 * ms},
        {"kind": "action", "step": 1},
        {"kind": "bubble_edge", "step": 1, "slot": 0, "edge": "end", "t_ns": 18 * ms},
        # a start without a prediction is left out: no step could be planned against it
        {"kind": "bubble_edge", "step": 1, "slot": 1, "edge": "start", "t_ns": 30 * ms},
        {"kind": "bubble_edge", "step": 1, "slot": 1, "edge": "end", "t_ns": 40 * ms},
        {"kind": "bubble_edge", "step": 2, "slot": 0, "edge": "start", "t_ns": 50 * ms,
         "predicted_end_ns": 55 * ms},
        {"kind": "bubble_edge", "step": 2, "slot": 0, "edge": "end", "t_ns": 57 * ms},
    ]  # fmt: skip
    whole = [{"rank": 1, "stage": 1, **e} if e["kind"] == "bubble_edge" else e for e in lines]
    (events / "rank-1.jsonl").write_text("".join(json.dumps(e) + "\n" for e in whole))
    assert bench_step_sizes.extract(tmp_path, 1) == [(20.0, 18.0), (5.0, 7.0)]


def test_work_counts_the_steps_that_began_in_a_bubble_and_their_time_up_to_its_end() -> None:
    ms = 1_000_000
    record = {
        "bubble_ns": [(0, 10 * ms), (20 * ms, 40 * ms)],
        "steps": [
            (1 * ms, 6 * ms, 16.0),
            (6 * ms, 12 * ms, 32.0),  # ran 2 ms past its bubble's end: 4 ms count
            (15 * ms, 19 * ms, 64.0),  # began between bubbles: not bubble work
            (21 * ms, 39 * ms, 64.0),
        ],
    }
    figures = bench_step_sizes.block_figures(record)
    assert figures["images_per_s"] == pytest.approx((16 + 32 + 64) / 0.030)
    assert figures["under_steps_frac"] == pytest.approx((5 + 4 + 18) / 30)


def test_the_replayed_task_offers_sizes_within_its_batch_and_sleeps_the_given_times() -> None:
    task = bench_step_sizes.ReplayedSlices({"1": 0.1, "2": 0.1, "4": 0.1})
    assert task.step_sizes == (1, 2, 4)
    assert task.step(1) == 16.0 and task.step_sizes == (1, 2)
    assert task.step(2) == 32.0 and task.step_sizes == (1,)
    fixed = bench_step_sizes.ReplayedSlices({"1": 0.1, "2": 0.1, "4": 0.1}, fixed=2)
    assert fixed.step_sizes == (1,) and fixed.step() == 32.0


@pytest.mark.slow
def test_both_arms_replay_through_a_real_task_host_and_differ_per_block(tmp_path: Path) -> None:
    """Five blocks of four 30 ms bubbles: each arm steps in every block; the difference comes
    with an interval."""
    bubbles = [(30.0, 30.0)] * 20
    out = bench_step_sizes.replay(bubbles, blocks=5, fixed=2, step_ms={1: 3.0, 2: 5.0, 4: 9.0})
    assert out["blocks"] == 5 and out["bubbles_per_block"] == 4
    for arm in ("fixed", "fit"):
        assert out["arms"][arm]["images_per_s"]["value"] > 0, arm
    diff = out["fit_minus_fixed"]["images_per_s"]
    assert diff["lo"] <= diff["value"] <= diff["hi"]
