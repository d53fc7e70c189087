"""benchmarks/bench_predictor.py: predictors replayed over recorded bubbles, scored per block."""

from __future__ import annotations

import pandas as pd
import pytest
from bench_scripts import load_script

bench_predictor = load_script("bench_predictor")


def _bubbles(lengths_ms: dict[int, list[float]], ranks: int = 2) -> pd.DataFrame:
    """Bubbles of ``ranks`` ranks: per step, one bubble per slot with the slot's length."""
    rows = []
    steps = len(next(iter(lengths_ms.values())))
    for rank in range(ranks):
        for step in range(steps):
            t = step * 100.0
            for slot, lengths in lengths_ms.items():
                rows.append({"rank": rank, "step": step, "slot": slot, "start_ms": t + slot,
                             "duration_ms": lengths[step]})  # fmt: skip
    return pd.DataFrame(rows)


def test_a_steady_trace_is_planned_whole_by_every_predictor_and_differs_by_nothing() -> None:
    out = bench_predictor.replay_run(_bubbles({0: [4.0] * 30, 1: [2.0] * 30}), skip=5, blocks=5)
    assert out["steps_measured"] == 25
    for name, e in out["predictors"].items():
        assert e["planned_frac"]["value"] == pytest.approx(1.0), name
        assert e["over_frac"]["value"] == 0.0 and e["miss_frac"]["value"] == 0.0
        assert e["bubbles"] == 2 * 2 * 25  # two ranks, two slots, the measured steps
    assert out["predictors"]["feedback"]["planned_frac_vs_min-of-5"]["value"] == 0.0
    assert "planned_frac_vs_min-of-5" not in out["predictors"]["min-of-5"]


def test_short_outliers_cost_the_minimum_of_five_its_next_five_bubbles() -> None:
    lengths = [1.0 if step % 10 == 9 else 4.0 for step in range(60)]
    out = bench_predictor.replay_run(_bubbles({0: lengths}, ranks=1), skip=0, blocks=6)
    m5, fb = out["predictors"]["min-of-5"], out["predictors"]["feedback"]
    assert m5["planned_frac"]["value"] < 0.7  # 1 ms predicted for five bubbles after each
    assert fb["planned_frac_vs_min-of-5"]["lo"] > 0  # the feedback one plans more, every block


def test_fewer_steps_than_blocks_is_refused() -> None:
    with pytest.raises(ValueError, match="3 measured steps cannot make 5 blocks"):
        bench_predictor.replay_run(_bubbles({0: [4.0] * 8}), skip=5, blocks=5)
