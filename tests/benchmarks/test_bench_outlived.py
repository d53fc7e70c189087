"""benchmarks/bench_outlived.py: past a predicted end, the survivors against stopping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_scripts import load_script

from freeride_lab.bench.readout import announced_bubbles
from freeride_lab.core.bubble_survival import SurvivorLengths

bench_outlived = load_script("bench_outlived")
Bubble = bench_outlived.Bubble
MS = 1_000_000


def test_announced_bubbles_are_read_with_step_slot_prediction_and_length(tmp_path: Path) -> None:
    events = tmp_path / "events"
    events.mkdir()
    lines = [
        {"kind": "bubble_edge", "step": 3, "slot": 2, "edge": "start", "t_ns": 0,
         "predicted_end_ns": 20 * MS},
        {"kind": "bubble_edge", "step": 3, "slot": 2, "edge": "end", "t_ns": 18 * MS},
        {"kind": "bubble_edge", "step": 3, "slot": 4, "edge": "start", "t_ns": 30 * MS},
        {"kind": "bubble_edge", "step": 3, "slot": 4, "edge": "end", "t_ns": 40 * MS},
    ]  # fmt: skip
    text = "".join(json.dumps({"rank": 0, "stage": 0, **e}) + "\n" for e in lines)
    (events / "rank-0.jsonl").write_text(text + '{"kind": "bubble_ed')  # a torn last line
    assert announced_bubbles(tmp_path, 0) == [Bubble(3, 2, 20.0, 18.0)]


def test_under_stop_steps_run_to_the_prediction_and_a_shorter_bubble_counts_as_overrun() -> None:
    assert bench_outlived.replay_bubble(Bubble(0, 0, 10.0, 14.0), None, 2 * MS) == (10 * MS, False)
    assert bench_outlived.replay_bubble(Bubble(0, 0, 10.0, 8.0), None, 2 * MS) == (8 * MS, True)
    # a prediction within the guard: no step at all
    assert bench_outlived.replay_bubble(Bubble(0, 0, 1.5, 8.0), None, 2 * MS) == (0, False)


def test_the_survivors_open_later_stretches_counted_once_and_up_to_the_bubbles_end() -> None:
    """Kept lengths 12 and 60 ms, predicted 5, guard 2: steps to 5 (the rank's), then 3..12
    (12 ms kind; only 5..12 is new), then, the 12 ms kind passed, 12..60 cut at the real 40,
    which ended before 60: an overrun allowed."""
    survivors = SurvivorLengths(min_survivors=2, max_early=0.0)
    for length in (12, 60, 12, 61, 12, 60):
        survivors.observe(0, length * MS)
    covered, overrun = bench_outlived.replay_bubble(Bubble(0, 0, 5.0, 40.0), survivors, 2 * MS)
    assert covered == 40 * MS and overrun


def test_a_gap_waited_out_is_not_counted_as_time_steps_may_run_in() -> None:
    """Kept lengths 10, 11 and 30 (min 1 survivor), guard 3: after the prediction (4) the room
    is up to 10; 10 and 11 are too close, so the next stretch starts at 11, and 10..11 stays
    out."""
    survivors = SurvivorLengths(k=4, min_survivors=1, max_early=0.0)
    for length in (10, 11, 30):
        survivors.observe(0, length * MS)
    covered, overrun = bench_outlived.replay_bubble(Bubble(0, 0, 4.0, 30.0), survivors, 3 * MS)
    assert covered == (4 + 6 + 19) * MS and not overrun


def test_every_arm_is_scored_per_block_against_stop_and_pauses_are_left_out() -> None:
    bubbles = [Bubble(s, 0, 5.0, 9.0 if s % 2 else 10.0) for s in range(60)]
    bubbles.append(Bubble(30, 1, 5.0, 2500.0))  # a bench pause: neither scored nor learnt
    res = bench_outlived.replay_rank(bubbles, guard_ms=1.0, blocks=5)
    assert res["bubbles"] == 60 and res["steps"] == 60
    stop = res["arms"]["stop"]
    assert stop["plannable_frac"]["value"] == pytest.approx(5 / 9.5, rel=1e-3)
    strict = res["arms"]["survivors 0"]
    assert strict["plannable_frac_vs_stop"]["value"] > 0.3  # up to 9 ms of every bubble
    with pytest.raises(ValueError, match="cannot make 5 blocks"):
        bench_outlived.replay_rank(bubbles[:3], guard_ms=1.0, blocks=5)
