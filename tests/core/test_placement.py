"""Placement on stages: FreeRide's rule (its §8 example included) and harvest-aware order."""

from __future__ import annotations

import itertools

import pytest
from freeride_paper import SIDE_TASKS
from hypothesis import given
from hypothesis import strategies as st

from freeride_lab.core.placement import (
    NoPlacement,
    Placement,
    QueuedTask,
    RefusalRule,
    StageInfo,
    TaskRequest,
    place,
    place_all,
    usable_ms,
)

GIB = 2**30
FREE_GIB = (3, 9, 16, 24)  # the 3.6B model, stages 0-3 (paper notes §2); GiB, as the requests

# FreeRide's six tasks, with the memory request (GiB) and step budget (s) of its §9 table.
TASKS = {row.name: row for row in SIDE_TASKS}


def _stages(bubble_ms: tuple[float, ...] | None = None) -> list[StageInfo]:
    return [
        StageInfo(stage=s, free_bytes=f * GIB, bubble_ms=bubble_ms) for s, f in enumerate(FREE_GIB)
    ]


def _request(name: str, priority: int = 0) -> TaskRequest:
    row = TASKS[name]
    return TaskRequest(
        name=name, memory_bytes=row.request_gib * GIB, budget_s=row.budget_s, priority=priority
    )


def _eligible_count(name: str) -> int:
    return sum(f > TASKS[name].request_gib for f in FREE_GIB)


@pytest.mark.parametrize(
    ("name", "stages"),
    [
        ("resnet18", [1, 2, 3]),
        ("resnet50", [1, 2, 3]),
        ("vgg19", [2, 3]),
        ("image", [2, 3]),
        ("pagerank", [0, 1, 2, 3]),
        ("sgd", [0, 1, 2, 3]),
    ],
)
def test_one_copy_per_eligible_stage_spreads_as_in_the_paper(name: str, stages: list[int]) -> None:
    copies = [_request(name)] * _eligible_count(name)
    outcomes, _ = place_all(copies, _stages(bubble_ms=(500.0,)))
    assert outcomes == [Placement(s) for s in stages]


def test_mix_in_submission_order_lands_one_task_per_stage_as_in_the_paper() -> None:
    order = ["pagerank", "resnet18", "image", "vgg19"]  # FreeRide's run_mix.py order
    outcomes, _ = place_all([_request(n) for n in order], _stages())
    assert outcomes == [Placement(0), Placement(1), Placement(2), Placement(3)]


def test_mix_reproduces_exactly_when_image_is_submitted_before_vgg19() -> None:
    """Of the 24 orders, the paper's layout comes out of the 12 with image before VGG-19."""
    names = ["pagerank", "resnet18", "image", "vgg19"]
    wanted = [Placement(0), Placement(1), Placement(2), Placement(3)]
    good = []
    for order in itertools.permutations(names):
        outcomes, _ = place_all([_request(n) for n in order], _stages())
        if [outcomes[order.index(n)] for n in names] == wanted:
            good.append(order)
    assert len(good) == 12
    assert all(o.index("image") < o.index("vgg19") for o in good)


def test_free_memory_equal_to_the_request_is_not_enough() -> None:
    stages = [StageInfo(stage=0, free_bytes=4 * GIB)]
    outcome = place(TaskRequest(name="t", memory_bytes=4 * GIB, budget_s=0.0), stages)
    assert isinstance(outcome, NoPlacement)
    assert outcome.refusals[0].rule is RefusalRule.MEMORY


def test_no_placement_lists_every_stage_and_its_rule() -> None:
    stages = _stages(bubble_ms=(100.0,))
    stages[3] = StageInfo(stage=3, free_bytes=24 * GIB, bubble_ms=(10.0, 20.0))
    outcome = place(_request("vgg19"), stages)
    assert isinstance(outcome, NoPlacement)
    assert [(r.stage, r.rule) for r in outcome.refusals] == [
        (0, RefusalRule.MEMORY),
        (1, RefusalRule.MEMORY),
        (2, RefusalRule.BUBBLE_FIT),
        (3, RefusalRule.BUBBLE_FIT),
    ]
    assert "'vgg19'" in outcome.reason and "stage 3: bubble_fit" in outcome.reason
    assert "longest predicted bubble 20.0 ms is not > step budget 216.0 ms" in outcome.reason


def test_bubble_fit_skips_a_stage_whose_bubbles_are_all_shorter_than_the_budget() -> None:
    stages = _stages()
    stages[1] = StageInfo(stage=1, free_bytes=9 * GIB, bubble_ms=(30.0, 40.0))  # < 48 ms
    assert place(_request("resnet18"), stages) == Placement(2)


def test_bubble_fit_needs_one_bubble_strictly_longer_than_the_budget() -> None:
    at = [StageInfo(stage=0, free_bytes=9 * GIB, bubble_ms=(10.0, 48.0))]
    above = [StageInfo(stage=0, free_bytes=9 * GIB, bubble_ms=(10.0, 48.5))]
    assert isinstance(place(_request("resnet18"), at), NoPlacement)
    assert place(_request("resnet18"), above) == Placement(0)


def test_a_stage_without_bubbles_fits_nothing_but_unprofiled_fits_all() -> None:
    none = [StageInfo(stage=0, free_bytes=9 * GIB, bubble_ms=())]
    unknown = [StageInfo(stage=0, free_bytes=9 * GIB, bubble_ms=None)]
    assert isinstance(place(_request("pagerank"), none), NoPlacement)
    assert place(_request("pagerank"), unknown) == Placement(0)


def test_zero_request_goes_to_the_most_free_memory_first() -> None:
    stages = _stages()
    busy = tuple(QueuedTask(f"q{i}") for i in range(5))
    stages[3] = StageInfo(stage=3, free_bytes=24 * GIB, queue=busy)
    task = TaskRequest(name="tiny", memory_bytes=0, budget_s=0.01)
    assert place(task, stages) == Placement(3)  # free memory outranks queue length


def test_zero_request_breaks_free_memory_ties_by_queue_length() -> None:
    stages = [
        StageInfo(stage=0, free_bytes=8 * GIB, queue=(QueuedTask("a"),)),
        StageInfo(stage=1, free_bytes=8 * GIB),
    ]
    assert place(TaskRequest(name="tiny", memory_bytes=0, budget_s=0.01), stages) == Placement(1)


def test_queue_length_counts_only_tasks_of_equal_or_higher_priority() -> None:
    stages = _stages()
    stages[1] = StageInfo(stage=1, free_bytes=9 * GIB, queue=(QueuedTask("low", priority=0),) * 3)
    stages[2] = StageInfo(stage=2, free_bytes=16 * GIB, queue=(QueuedTask("hi", priority=5),))
    assert place(_request("resnet18", priority=1), stages) == Placement(1)  # 0 tasks >= 1 there
    assert place(_request("resnet18", priority=0), stages) == Placement(3)


def test_ties_go_to_the_lowest_stage_index() -> None:
    assert place(_request("pagerank"), _stages()) == Placement(0)


def test_place_all_queues_placed_tasks_under_their_id() -> None:
    _, stages = place_all([_request("vgg19"), _request("vgg19")], _stages())
    assert [t.task_id for t in stages[2].queue] == ["vgg19#0"]
    assert [t.task_id for t in stages[3].queue] == ["vgg19#1"]


def test_place_all_leaves_queues_alone_for_unplaceable_tasks() -> None:
    huge = TaskRequest(name="huge", memory_bytes=100 * GIB, budget_s=0.0)
    outcomes, stages = place_all([huge], _stages())
    assert isinstance(outcomes[0], NoPlacement)
    assert all(s.queue == () for s in stages)


# -- harvest-aware placement ------------------------------------------------------------------


def _stage(stage: int, bubbles: tuple[float, ...] | None, queue: int = 0) -> StageInfo:
    tasks = tuple(QueuedTask(f"q{stage}{i}", 0) for i in range(queue))
    return StageInfo(stage=stage, free_bytes=8 * 2**30, bubble_ms=bubbles, queue=tasks)


def test_harvest_placement_prefers_bubbles_the_steps_fill_over_freerides_first_fit() -> None:
    task = TaskRequest(name="resnet18", memory_bytes=2**30, budget_s=0.020, step_s=0.017)
    stages = [_stage(0, (30.0, 30.0)), _stage(1, (90.0,))]
    assert place(task, stages) == Placement(0)
    assert place(task, stages, policy="harvest") == Placement(1)


def test_harvest_shares_a_stage_with_its_queue_and_falls_back_without_bubbles() -> None:
    task = TaskRequest(name="pagerank", memory_bytes=2**30, budget_s=0.002, step_s=0.001)
    busy_long = _stage(0, (100.0,), queue=3)  # 98 ms of steps, shared by 4
    quiet_short = _stage(1, (40.0,))  # 38 ms, its own
    assert place(task, [busy_long, quiet_short], policy="harvest") == Placement(1)
    unmeasured = [_stage(0, None, queue=1), _stage(1, None)]
    assert place(task, unmeasured, policy="harvest") == place(task, unmeasured)


def test_a_task_that_steps_in_slices_is_judged_by_its_smallest_step() -> None:
    """VGG-19 in quarter-batch slices: its whole 59 ms step (65 ms budget) fits no bubble of a
    stage whose longest is 59 ms, a slice (15 ms, 16 ms budget) fits several; only the whole
    step's view refuses the stage. The harvest order counts the slices in each bubble's tail."""
    whole = TaskRequest(name="vgg19", memory_bytes=2**30, budget_s=0.065, step_s=0.0587)
    sliced = TaskRequest(name="vgg19", memory_bytes=2**30, budget_s=0.065, step_s=0.0587,
                         smallest_step_s=0.0587 / 4)  # fmt: skip
    short = _stage(0, (45.0, 59.0, 35.0))
    refused = place(whole, [short])
    assert isinstance(refused, NoPlacement)
    assert "is not > step budget 65.0 ms" in refused.refusals[0].detail
    assert place(sliced, [short]) == Placement(0)
    assert place(sliced, [short], policy="harvest") == Placement(0)
    tiny = place(sliced, [_stage(0, (12.0,))])
    assert isinstance(tiny, NoPlacement)
    assert "is not > its smallest step's budget 16.2 ms" in tiny.refusals[0].detail
    # a long bubble: whole steps, then slices in its tail
    assert sliced.smallest == pytest.approx((0.01625, 0.014675))
    assert usable_ms([140.0], 65.0, 58.7, smallest_ms=(16.25, 14.675)) == pytest.approx(
        2 * 58.7 + 14.675
    )


@pytest.mark.parametrize("smallest", [0.0, -1.0, float("nan")])
def test_a_smallest_step_must_be_a_positive_time(smallest: float) -> None:
    with pytest.raises(ValueError, match="smallest_step_s="):
        TaskRequest(name="x", memory_bytes=0, budget_s=0.01, step_s=0.01, smallest_step_s=smallest)


def test_place_all_orders_each_submission_by_the_policy_it_is_given() -> None:
    """Submitted in turn, tasks go where their steps fill most, a queued task halving what
    its stage offers the next one; FreeRide's rule spreads them in stage order."""
    task = TaskRequest(name="resnet18", memory_bytes=2**30, budget_s=0.020, step_s=0.017)
    stages = [_stage(0, (30.0, 30.0, 30.0)), _stage(1, (90.0,)), _stage(2, (25.0,))]
    by_policy = {
        policy: [o.stage for o in place_all([task] * 3, stages, policy=policy)[0]
                 if isinstance(o, Placement)]
        for policy in ("freeride", "harvest")
    }  # fmt: skip
    # usable: 51, 85, 17 ms; then 51 vs 85 / 2; then 51 / 2 vs 85 / 2 vs 17
    assert by_policy == {"freeride": [0, 1, 2], "harvest": [1, 0, 1]}
    with pytest.raises(ValueError, match="placement='best' is unknown"):
        place_all([task], stages, policy="best")


def test_an_unknown_placement_policy_names_the_valid_ones() -> None:
    task = TaskRequest(name="x", memory_bytes=0, budget_s=0.01)
    with pytest.raises(ValueError, match="placement='best' is unknown; valid: freeride, harvest"):
        place(task, [_stage(0, (20.0,))], policy="best")


@given(
    bubbles=st.lists(st.floats(0.0, 500.0), max_size=8),
    budget=st.floats(0.1, 100.0),
    step=st.floats(0.1, 100.0),
)
def test_usable_time_never_exceeds_the_bubbles_and_needs_room_for_a_step(
    bubbles: list[float], budget: float, step: float
) -> None:
    used = usable_ms(bubbles, budget, step)
    assert 0.0 <= used <= sum(b for b in bubbles if b > budget) + 1e-9
    if all(b <= budget for b in bubbles):
        assert used == 0.0
