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


def _fed_run(
    steps: int = 30, starts_ms: tuple[float, ...] = (0.0, 0.5, 0.9)
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rank 1 idles from 1 ms into each step until rank 0's forward has ended and 0.3 ms
    more; rank 0 starts that 2 ms forward ``starts_ms`` into the steps, in turn. (bubbles,
    actions)."""
    actions, bubbles = [], []
    for step in range(steps):
        t, early = 100.0 * step, starts_ms[step % len(starts_ms)]
        fed = t + early + 2.3
        for rank, start, end in ((0, t + early, t + early + 2.0), (1, fed, fed + 1.0)):
            actions.append({"step": step, "rank": rank, "stage": rank, "action": "F",
                            "microbatch": 0, "start_ms": start, "end_ms": end,
                            "duration_ms": end - start})  # fmt: skip
        bubbles.append({"step": step, "rank": 1, "slot": 0, "start_ms": t + 1.0,
                        "end_ms": fed, "duration_ms": fed - t - 1.0, "before": "1F0"})  # fmt: skip
    return pd.DataFrame(bubbles), pd.DataFrame(actions)


def test_the_peer_predictor_plans_each_bubble_to_its_awaited_peers_end() -> None:
    bubbles, actions = _fed_run()
    out = bench_predictor.replay_run(bubbles, skip=5, blocks=5, actions=actions)
    peers, m5 = out["predictors"]["peers"], out["predictors"]["min-of-5"]
    assert peers["planned_frac"]["value"] == pytest.approx(1.0)
    assert peers["over_frac"]["value"] == 0.0
    assert m5["planned_frac"]["value"] < 0.8  # 1.3 ms of bubbles lasting 1.3 to 2.2 ms
    assert peers["planned_frac_vs_min-of-5"]["lo"] > 0
    assert out["with_peer_end"] == 1.0  # every scored bubble's peer had started before it


def test_a_bubble_has_no_published_end_where_its_peer_started_after_it_began() -> None:
    bubbles, actions = _fed_run(steps=4)
    late = actions["rank"] == 0
    actions.loc[late, "start_ms"] += 5.0  # rank 0 starts 5 ms later than rank 1 idles
    ends = bench_predictor.published_ends(bubbles, actions)
    assert ends == {}
    assert bench_predictor.published_ends(*_fed_run(steps=4)).keys() == {1, 2, 3}  # not step 0


def test_without_actions_no_peer_predictor_is_replayed() -> None:
    out = bench_predictor.replay_run(_fed_run()[0], skip=5, blocks=5)
    assert "peers" not in out["predictors"]


def test_a_peers_end_told_mid_bubble_fills_what_the_slots_past_left() -> None:
    """Every third step rank 0 starts its forward 0.4 ms after rank 1 began to idle: no end
    is published at the bubble's start, which is planned to the slot's minimum (1.3 ms of
    2.7 ms); told mid-bubble, the rest is planned too."""
    bubbles, actions = _fed_run(starts_ms=(0.0, 0.5, 1.4))
    out = bench_predictor.replay_run(bubbles, skip=5, blocks=5, actions=actions)
    peers, told = out["predictors"]["peers"], out["predictors"]["peers-told"]
    assert peers["planned_frac"]["value"] < 0.9
    assert told["planned_frac"]["value"] == pytest.approx(1.0)
    assert told["over_frac"]["value"] == 0.0 and told["miss_frac"]["value"] == 0.0
    assert out["with_peer_end"] == pytest.approx(2 / 3, abs=0.05)
