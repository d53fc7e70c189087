"""benchmarks/harvest_ceiling.py: a stage's bubbles replayed with what they held, one change at
a time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bench_scripts import load_script

ceiling = load_script("harvest_ceiling")
Size, Menu, Groups = ceiling.Size, ceiling.Menu, ceiling.Groups


def _sized(per_ms: float = 1.0, gap_ms: float = 0.0) -> Any:
    """Steps of 1, 2 and 4 units lasting 1, 2 and 4 ms, each guarded by 1.5 x its time."""
    sizes = (Size(1.0, 1.0, 1.5), Size(2.0, 2.0, 3.0), Size(4.0, 4.0, 6.0))
    return Menu(sizes, first_ms=0.0, gap_ms=gap_ms, per_ms=per_ms)


def test_a_bubble_is_filled_coarse_to_fine_while_the_smallest_guard_fits() -> None:
    # to an end at 10 ms: a step of 4 (its guard of 6 fits the 10 left); with 6 left, 4's guard
    # no longer fits and 2's does: a step of 2, and another with 4 left; with 2 left only the
    # smallest's guard (1.5) fits: a step of 1; with 1 left, none: 9 ms of steps
    last, under, work, (launched, crossed) = ceiling.pack(_sized(), 0.0, 10.0, 10.0)
    assert (last, under, work, launched, crossed) == (9.0, 9.0, 9.0, 4, 0)


def test_no_step_starts_once_the_bubble_has_ended_and_one_in_flight_counts_to_its_end() -> None:
    # planned to 10 ms (a prediction too long), the bubble ends at 5: 4 ms, then a 1 ms step
    # (guard 1.5 < 6 left by the plan) from 4 to 5; nothing after the end
    last, under, work, (_, crossed) = ceiling.pack(_sized(), 0.0, 10.0, 5.0)
    assert under == 5.0 and last >= 5.0 and crossed == 1  # the step in flight at the end
    # planned to the true end, the same bubble takes 2, 1 and 1: no step crosses its end
    last, under, work, (_, crossed) = ceiling.pack(_sized(), 0.0, 5.0, 5.0)
    assert (last, work, crossed) == (4.0, 4.0, 0)


def test_without_the_margin_a_step_needs_only_its_own_time() -> None:
    # 4.5 ms: with the margin, 2 (guard 3) then 1 (guard 1.5 of the 2.5 left); without it,
    # the step of 4 fits whole and the 0.5 ms left hold nothing
    assert ceiling.pack(_sized(), 0.0, 4.5, 4.5)[2] == 3.0
    assert ceiling.pack(_sized(), 0.0, 4.5, 4.5, margin=False)[2] == 4.0


def test_a_grouped_task_launches_groups_bounded_by_their_length_and_the_bubble() -> None:
    groups = Groups(unit=1.0, base_ms=0.1, step_ms=0.1, median_ms=0.1, group_ms=1.0)
    menu = Menu((Size(1.0, 0.1, 0.5),), first_ms=0.0, gap_ms=0.0, per_ms=10.0, groups=groups)
    # to 1.5 ms: a group of 10 (1.1 ms); then 0.4 ms left, under the guard of 0.5: stop
    last, under, work, _ = ceiling.pack(menu, 0.0, 1.5, 1.5)
    assert last == under == pytest.approx(1.1) and work == pytest.approx(1.0)
    # to 0.8 ms: the group keeps its last step's guard, 1 + (0.8 - 0.5) // 0.1 = 4 steps
    # (0.5 ms), as the host counts them; then 0.3 ms left: stop
    last, _, work, _ = ceiling.pack(menu, 0.0, 0.8, 0.8)
    assert last == pytest.approx(0.5) and work == pytest.approx(0.4)


def test_a_ledger_that_records_calls_says_which_task_steps_in_groups() -> None:
    """Records of 2 and 4 calls double like a sized task's steps: the calls, where the ledger
    has them, say they are groups; without them the progress reads as step sizes."""
    steps = [("b", 0.2, 1.2, 0.5, 2.0), ("b", 1.3, 3.3, 0.5, 4.0), ("b", 3.4, 5.4, 0.5, 4.0)]

    def bubble(with_calls: bool) -> dict[str, Any]:
        rows = [(*s, int(s[4])) if with_calls else s for s in steps]
        return _bubble(10.0, 10.0, *rows)

    per_s = {"b": 1000.0}
    with_calls, _ = ceiling.menus([bubble(True)] * 3, "b", per_s, {}, 1.0)
    without, _ = ceiling.menus([bubble(False)] * 3, "b", per_s, {}, 1.0)
    assert with_calls["b"].groups is not None
    assert without["b"].groups is None


def test_steps_that_do_not_double_are_groups() -> None:
    assert ceiling.steps_in_groups({1.0: [0.2], 3.0: [0.5], 8.0: [1.0]})
    assert not ceiling.steps_in_groups({0.0078125: [1.0], 0.015625: [1.5], 0.0625: [4.4]})


def _bubble(length: float, predicted: float | None, *steps: tuple[Any, ...]) -> dict[str, Any]:
    return {"mode": "governed", "repeat": 0, "step": 1, "slot": 0, "length_ms": length,
            "predicted_ms": predicted, "steps": [list(s) for s in steps]}  # fmt: skip


def _block(repeat: int, predicted: float) -> list[dict[str, Any]]:
    """Bubbles of 10 ms predicted at ``predicted``: the main task "a" steps 4, 2 and 1 ms (as
    many units) from 0.2 ms, 0.1 ms apart, guarded by 1.5 x; "b" (on the leftovers) a 1 ms
    step of 0.5 units (guard 1.2 ms) after a hand-on of 0.3 ms; every third bubble, 2 ms
    long, "b"'s alone."""
    rows = []
    for i in range(6):
        if i % 3 == 2:
            rows.append(_bubble(2.0, 2.0, ("b", 0.2, 1.2, 1.2, 0.5)))
            continue
        rows.append(_bubble(10.0, predicted, ("a", 0.2, 4.2, 1.5, 4.0),
                            ("a", 4.3, 6.3, 1.5, 2.0), ("a", 6.4, 7.4, 1.5, 1.0),
                            ("b", 7.7, 8.7, 1.2, 0.5)))  # fmt: skip
    for r in rows:
        r["repeat"] = repeat
    return rows


def test_the_arms_change_one_thing_each_and_the_model_matches_what_it_replays() -> None:
    per_s = {"a": 1000.0, "b": 500.0}  # a unit a ms; b half a unit a ms
    figures = ceiling.replay_block(_block(0, 9.0), per_s, "a", "b", {}, 1.0)
    assert set(figures) == {*ceiling.ARMS, ceiling.OVERRUN}
    assert figures[ceiling.OVERRUN] == 0.0  # predicted 1 ms short: no step crosses an end
    # observed: 4 bubbles x (7 + 1) ms of work and 2 x 1 ms over 44 ms of bubbles
    assert figures["observed"] == pytest.approx((4 * 8 + 2 * 1) / 44)
    # the rule replayed on the steps it learnt from gives back what they did
    assert figures["predicted"] == pytest.approx(figures["observed"])
    assert figures["true_end"] >= figures["predicted"]
    assert figures["no_margin"] >= figures["true_end"] - 1e-9
    assert 0 < figures["at_speed_alone"] <= 1


def test_another_guard_is_replayed_with_the_steps_it_lets_cross_the_end() -> None:
    """ "a" on a guard of 0.5 ms instead of 1.5: in bubbles predicted 1 ms too long (11 ms of
    10), it takes a fourth step with 2 ms left of the plan, which crosses the true end."""
    per_s = {"a": 1000.0, "b": 500.0}
    block = _block(0, 11.0)
    own = ceiling.replay_block(block, per_s, "a", "b", {}, 1.0)
    narrow = ceiling.replay_block(block, per_s, "a", "b", {}, 1.0, {"a": 0.5})
    assert narrow["predicted"] > own["predicted"]
    assert narrow[ceiling.OVERRUN] > own[ceiling.OVERRUN]


def test_a_step_spanning_two_bubbles_counts_in_the_first_only() -> None:
    first = _bubble(5.0, 5.0, ("a", 1.0, 7.0, 1.0, 1.0))
    second = _bubble(5.0, 5.0, ("a", -4.0, 2.0, 1.0, 1.0))  # the same step, seen from here
    figures = ceiling.replay_block([first, second], {"a": 1000.0}, "a", None, {}, 1.0)
    assert figures["observed"] == pytest.approx(1.0 / 10.0)


def _result() -> dict[str, Any]:
    segment = {"stage": 1, "task": "a", "dedicated_per_s": 1000.0, "top_step_size": 4,
               "leftovers": {"task": "b", "dedicated_per_s": 500.0}}  # fmt: skip
    return {
        "config": {"step_group_ms": 1.0},
        "runs": [{"name": "m8", "segments": [segment]}],
        "blocks": [{"run": "m8", "stage": 1, "task": "a", "leftovers_task": "b"}],
    }


def test_a_stage_gets_each_arm_and_each_cost_with_an_interval_over_its_blocks(
    tmp_path: Path,
) -> None:
    bubbles = [b for r in range(5) for b in _block(r, 8.0 + 0.2 * r)]
    ledger = {"stages": {"m8/1": {"bubbles": bubbles}}}
    found = ceiling.ceiling(_result(), ledger)["m8/1"]
    assert (found["main"], found["leftovers"]) == ("a", "b")
    assert len(found["blocks"]) == 5
    assert set(found["costs"]) == {*ceiling.COSTS, "beyond any rule"}
    for one in (*found["summary"].values(), *found["costs"].values()):
        assert one["lo"] <= one["value"] <= one["hi"]
    # the costs and what is left add up to all of the bubbles' time
    s, c = found["summary"], found["costs"]
    total = s["observed"]["value"] + sum(v["value"] for v in c.values())
    assert total == pytest.approx(1.0, abs=1e-3)

    result_path, ledger_path = tmp_path / "r.json", tmp_path / "l.json"
    result_path.write_text(json.dumps(_result()))
    ledger_path.write_text(json.dumps(ledger))
    out = tmp_path / "ceiling.json"
    assert ceiling.main([str(result_path), str(ledger_path), "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["stages"]["m8/1"]["summary"] == found["summary"]
    assert written["guard_ms"] == {}
    guarded = tmp_path / "guarded.json"
    argv = [str(result_path), str(ledger_path), "--guard-ms", "a=0.5", "--out", str(guarded)]
    assert ceiling.main(argv) == 0
    assert json.loads(guarded.read_text())["guard_ms"] == {"a": 0.5}
    for bad in ("a=fast", "a=inf", "a=nan", "a=0", "=0.5"):  # a guard is a finite time > 0
        with pytest.raises(SystemExit):
            ceiling.main([*argv[:3], bad, "--out", str(guarded)])
    assert (written["result"], written["ledger"]) == ("r.json", "l.json")


def test_each_tasks_steps_and_the_gaps_between_them_in_one_bubble() -> None:
    bubble = _bubble(10.0, 9.0, ("b", 7.7, 8.7, 1.2, 0.5), ("a", 0.2, 4.2, 1.5, 4.0),
                     ("a", -3.0, 0.1, 1.5, 1.0), ("a", 4.3, 6.3, 1.5, 2.0))  # fmt: skip
    by_task = ceiling.steps_by_task(bubble)
    assert [s[1] for s in by_task["a"]] == [0.2, 4.3]  # in time order, its own steps only
    assert ceiling.gaps_ms(by_task["a"]) == pytest.approx([0.1])
    assert ceiling.gaps_ms(by_task["b"]) == []


def test_a_ledger_read_from_another_result_is_refused_by_name() -> None:
    ledger = {"stages": {"m4/2": {"bubbles": _block(0, 8.0)}}}  # the result has m8 stage 1 only
    with pytest.raises(SystemExit, match="stage m4/2 has no block in the result"):
        ceiling.ceiling(_result(), ledger)
