"""Claims about bubble extraction, FreeRide labels, fractions and predictions (pure data).

The complete table (step boundaries, the optimizer) is also checked as a property over generated
timelines against ``tests/bubble_table.py``, which states its invariants from first principles.

Over 500 lines: every claim about one table (the bubbles), so its invariants read in one place.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest
from bubble_table import assert_complete_and_exact
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from freeride_lab.core.bubbles import (
    BUBBLE_COLUMNS,
    SlotPredictor,
    bubble_fraction,
    extract_bubbles,
    free_memory,
    predict_bubbles,
    step_windows,
    summary,
)
from freeride_lab.core.theory import theory_bubble_fraction

# --- an idealised 1F1B timeline ---------------------------------------------------------------


def order_1f1b(stages: int, microbatches: int, stage: int) -> list[tuple[str, int]]:
    """The order torch's ``Schedule1F1B._step_microbatches`` runs on one stage.

    min(M, S - s) warm-up forwards, then B/F alternating until the forwards run out, then
    the remaining backwards. (``torch_plan``'s 1F1B ``pipeline_order`` in torch 2.13 differs
    from what ``_step_microbatches`` runs, so the fixture spells the executed order out.)
    """
    warmup = min(microbatches, stages - stage)
    order = [("F", j) for j in range(warmup)]
    fwd, bwd = warmup, 0
    while True:
        order.append(("B", bwd))
        bwd += 1
        if fwd == microbatches:
            break
        order.append(("F", fwd))
        fwd += 1
    return order + [("B", j) for j in range(bwd, microbatches)]


def ideal_1f1b(
    stages: int,
    microbatches: int,
    *,
    steps: int = 1,
    t_f: float = 1.0,
    t_b: float = 2.0,
    dispatch_ms: float = 0.0,
    step_gap_ms: float = 5.0,
) -> pd.DataFrame:
    """Actions of an idealised 1F1B run: F(s, j) after F(s-1, j), B(s, j) after B(s+1, j).

    Every action starts ``dispatch_ms`` after it is ready (0: an exact timeline); steps follow
    each other ``step_gap_ms`` apart (the optimizer step).
    """
    rows: list[dict[str, object]] = []
    t0 = 0.0
    orders = [order_1f1b(stages, microbatches, s) for s in range(stages)]
    for step in range(steps):
        end: dict[tuple[int, str, int], float] = {}
        free = [t0] * stages
        nxt = [0] * stages
        progressed = True
        while progressed:
            progressed = False
            for s in range(stages):
                while nxt[s] < len(orders[s]):
                    kind, j = orders[s][nxt[s]]
                    if kind == "F":
                        dep = None if s == 0 else (s - 1, "F", j)
                    else:
                        dep = (s, "F", j) if s == stages - 1 else (s + 1, "B", j)
                    if dep is not None and dep not in end:
                        break
                    ready = t0 if dep is None else end[dep]
                    start = max(free[s], ready) + dispatch_ms
                    end[(s, kind, j)] = free[s] = start + (t_f if kind == "F" else t_b)
                    nxt[s] += 1
                    progressed = True
                    rows.append(
                        {
                            "step": step,
                            "rank": s,
                            "stage": s,
                            "action": kind,
                            "microbatch": j,
                            "start_ms": start,
                            "end_ms": free[s],
                        }
                    )
        t0 = max(free) + step_gap_ms
    a = pd.DataFrame(rows)
    a["duration_ms"] = a["end_ms"] - a["start_ms"]
    return a


def labels_by_stage(bubbles: pd.DataFrame, step: int = 0) -> dict[int, list[str]]:
    b = bubbles[bubbles["step"] == step]
    return {int(r): list(g["label"].fillna("-")) for r, g in b.groupby("rank")}


def actions_of(rows: list[tuple[int, int, str, int, float, float]]) -> pd.DataFrame:
    """A hand-written actions frame from (step, rank, action, microbatch, start, end) rows."""
    return pd.DataFrame(
        rows, columns=["step", "rank", "action", "microbatch", "start_ms", "end_ms"]
    ).assign(stage=lambda d: d["rank"])


# --- step windows -----------------------------------------------------------------------------


def test_step_window_spans_earliest_start_to_latest_end_on_any_rank() -> None:
    a = actions_of([(0, 0, "F", 0, 1.0, 2.0), (0, 1, "F", 0, 2.0, 3.0), (1, 1, "F", 0, 9.0, 12.0)])
    w = step_windows(a)
    assert w.to_dict("list") == {
        "step": [0, 1],
        "start_ms": [1.0, 9.0],
        "end_ms": [3.0, 12.0],
        "duration_ms": [2.0, 3.0],
    }


# --- FreeRide labels --------------------------------------------------------------------------


def test_1f1b_s4_m4_labels_match_freeride_taxonomy() -> None:
    b = extract_bubbles(ideal_1f1b(4, 4), schedule="1F1B", stages=4, microbatches=4)
    assert {s: set(labels) for s, labels in labels_by_stage(b).items()} == {
        0: {"B", "D"},
        1: {"A", "B", "D", "C"},
        2: {"A", "B", "D", "C"},
        3: {"A"},
    }


def test_1f1b_s4_m4_labels_come_in_paper_time_order() -> None:
    b = extract_bubbles(ideal_1f1b(4, 4), schedule="1F1B", stages=4, microbatches=4)
    assert labels_by_stage(b) == {
        0: ["B", "D", "D", "D"],
        1: ["A", "B", "D", "D", "C"],
        2: ["A", "B", "D", "C"],
        3: ["A", "A"],
    }


def test_last_stage_trailing_gap_is_labelled_a_as_the_drain_half_of_the_next_step_fill() -> None:
    b = extract_bubbles(ideal_1f1b(4, 4), schedule="1F1B", stages=4)
    last = b[b["rank"] == 3].iloc[-1]
    assert (last["kind"], last["label"], last["before"], last["after"]) == ("end", "A", "", "3B3")


def test_stage2_b_bubble_is_reported_on_stage2() -> None:
    b = extract_bubbles(ideal_1f1b(4, 4), schedule="1F1B", stages=4)
    row = b[b["label"].eq("B") & b["rank"].eq(2)]
    assert row[["stage", "after", "before"]].values.tolist() == [[2, "2F1", "2B0"]]


@pytest.mark.parametrize(("stages", "microbatches"), [(2, 4), (4, 8), (8, 8), (4, 2), (3, 1)])
def test_1f1b_label_counts_follow_paper_rules_for_any_s_and_m(
    stages: int, microbatches: int
) -> None:
    b = extract_bubbles(
        ideal_1f1b(stages, microbatches), schedule="1F1B", stages=stages, microbatches=microbatches
    )
    got = {s: Counter(labels) for s, labels in labels_by_stage(b).items()}
    expected = {}
    for s in range(stages):
        inner = s <= stages - 2
        expected[s] = +Counter(
            {
                # fill on s >= 1, plus the last stage's drain (merged into its next A)
                "A": int(s >= 1) + int(s == stages - 1),
                "B": int(inner),
                "C": int(1 <= s <= stages - 2),
                "D": min(microbatches - 1, stages - 1 - s) if inner else 0,
            }
        )
    assert got == expected


def test_1f1b_b_bubble_is_the_longest_gap_of_stage0() -> None:
    b = extract_bubbles(ideal_1f1b(4, 8), schedule="1F1B", stages=4)
    stage0 = b[b["rank"] == 0]
    assert stage0.loc[stage0["duration_ms"].idxmax(), "label"] == "B"


def test_min_ms_drops_dispatch_slivers_so_labels_match_the_ideal_timeline() -> None:
    real = ideal_1f1b(4, 4, dispatch_ms=0.01)
    b = extract_bubbles(real, schedule="1F1B", stages=4, microbatches=4, min_ms=0.05)
    assert labels_by_stage(b) == labels_by_stage(
        extract_bubbles(ideal_1f1b(4, 4), schedule="1F1B", stages=4)
    )


def test_dispatch_slivers_kept_by_min_ms_zero_get_no_label() -> None:
    real = ideal_1f1b(4, 4, dispatch_ms=0.01)
    b = extract_bubbles(real, schedule="1F1B", stages=4, microbatches=4)
    slivers = b[b["duration_ms"] < 0.05]
    assert len(slivers) > 0 and slivers["label"].isna().all()


def test_labels_are_nan_for_schedules_other_than_1f1b() -> None:
    b = extract_bubbles(ideal_1f1b(4, 4), schedule="GPipe", stages=4)
    assert b["label"].isna().all()


def test_labels_are_nan_without_a_schedule() -> None:
    assert extract_bubbles(ideal_1f1b(4, 4))["label"].isna().all()


def test_incomplete_step_is_left_unlabelled_when_microbatches_given() -> None:
    a = ideal_1f1b(4, 4, steps=2)
    partial = a[~((a["step"] == 1) & (a["rank"] == 1) & (a["microbatch"] == 3))]
    b = extract_bubbles(partial, schedule="1F1B", stages=4, microbatches=4)
    rank1 = b[b["rank"] == 1]
    assert rank1[rank1["step"] == 1]["label"].isna().all()
    assert rank1[rank1["step"] == 0]["label"].notna().all()


# --- gap geometry -----------------------------------------------------------------------------


def test_1f1b_s4_m4_kinds_are_warmup_then_cooldown_then_end() -> None:
    b = extract_bubbles(ideal_1f1b(4, 4), schedule="1F1B", stages=4)
    kinds = {int(r): list(g["kind"]) for r, g in b.groupby("rank")}
    assert kinds == {
        0: ["warmup", "cooldown", "cooldown", "cooldown"],
        1: ["warmup", "warmup", "cooldown", "cooldown", "end"],
        2: ["warmup", "warmup", "cooldown", "end"],
        3: ["warmup", "end"],
    }


def test_gap_between_first_backward_and_last_forward_is_steady() -> None:
    a = actions_of(
        [(0, 0, "F", 0, 0.0, 1.0), (0, 0, "B", 0, 1.0, 2.0), (0, 0, "F", 1, 3.0, 4.0),
         (0, 0, "B", 1, 4.0, 5.0)]
    )  # fmt: skip
    assert list(extract_bubbles(a)["kind"]) == ["steady"]


def test_slots_number_each_rank_gaps_from_zero_in_time_order() -> None:
    b = extract_bubbles(ideal_1f1b(4, 4, steps=2), schedule="1F1B", stages=4)
    for _, g in b.groupby(["step", "rank"]):
        assert list(g["slot"]) == list(range(len(g)))
        assert g["start_ms"].is_monotonic_increasing


def test_before_and_after_name_the_actions_around_each_gap() -> None:
    b = extract_bubbles(ideal_1f1b(4, 4), schedule="1F1B", stages=4)
    rank1 = b[b["rank"] == 1]
    assert list(zip(rank1["after"], rank1["before"], strict=True)) == [
        ("", "1F0"), ("1F2", "1B0"), ("1B1", "1B2"), ("1B2", "1B3"), ("1B3", "")
    ]  # fmt: skip


def test_overlapping_actions_on_a_rank_are_merged_before_finding_gaps() -> None:
    a = actions_of(
        [(0, 0, "F", 0, 0.0, 10.0), (0, 0, "F", 1, 2.0, 4.0), (0, 0, "B", 0, 6.0, 12.0),
         (0, 1, "F", 0, 0.0, 20.0)]
    )  # fmt: skip
    rank0 = extract_bubbles(a).query("rank == 0")
    assert rank0[["start_ms", "end_ms"]].values.tolist() == [[12.0, 20.0]]


def test_gaps_not_longer_than_min_ms_are_dropped() -> None:
    b = extract_bubbles(ideal_1f1b(4, 4), min_ms=1.0)
    assert (b["duration_ms"] > 1.0).all() and len(b) == 8


def test_multi_chunk_rank_reports_its_lowest_stage() -> None:
    a = actions_of([(0, 0, "F", 0, 0.0, 1.0), (0, 0, "F", 0, 3.0, 4.0), (0, 1, "F", 0, 1.0, 2.0)])
    a.loc[1, "stage"] = 2
    assert set(extract_bubbles(a).query("rank == 0")["stage"]) == {0}


# --- fractions and summary --------------------------------------------------------------------


def test_bubble_durations_sum_to_idle_ms_per_rank_and_step() -> None:
    a = ideal_1f1b(4, 8, steps=2, dispatch_ms=0.01)
    gaps = extract_bubbles(a).groupby(["rank", "step"])["duration_ms"].sum()
    idle = bubble_fraction(a).set_index(["rank", "step"])["idle_ms"]
    pd.testing.assert_series_equal(gaps, idle, check_names=False)


@pytest.mark.parametrize(("stages", "microbatches"), [(4, 4), (4, 8), (2, 4)])
def test_ideal_1f1b_idle_fraction_equals_theory_on_every_rank(
    stages: int, microbatches: int
) -> None:
    frac = bubble_fraction(ideal_1f1b(stages, microbatches))["idle_frac"]
    assert np.allclose(frac, theory_bubble_fraction("1F1B", stages, microbatches))


def test_bubble_fraction_counts_overlapping_actions_once() -> None:
    a = actions_of([(0, 0, "F", 0, 0.0, 6.0), (0, 0, "F", 1, 2.0, 4.0), (0, 1, "F", 0, 0.0, 10.0)])
    row = bubble_fraction(a).query("rank == 0").iloc[0]
    assert (row["busy_ms"], row["idle_ms"], row["idle_frac"]) == (6.0, 4.0, 0.4)


def test_summary_puts_measured_and_theory_side_by_side() -> None:
    s = summary(ideal_1f1b(4, 8, steps=3), "1F1B", 4, 8)
    assert np.allclose(s["measured_frac"], 3 / 11) and np.allclose(s["delta_pts"], 0.0)


def test_summary_reports_largest_gap_per_rank() -> None:
    s = summary(ideal_1f1b(4, 8, steps=3), "1F1B", 4, 8)
    assert s["largest_gap_ms"].tolist() == [6.0, 4.0, 4.0, 6.0]


def test_summary_skips_warmup_steps() -> None:
    a = ideal_1f1b(4, 8, steps=3)
    slow_first = a.assign(end_ms=np.where(a["step"] == 0, a["end_ms"] + 0.5, a["end_ms"]))
    assert np.allclose(summary(slow_first, "1F1B", 4, 8, skip_steps=1)["delta_pts"], 0.0)


def test_summary_rejects_skip_steps_that_leave_no_step() -> None:
    with pytest.raises(ValueError, match="skip_steps=1 leaves none of the 1"):
        summary(ideal_1f1b(4, 4), "1F1B", 4, 4, skip_steps=1)


def test_summary_gives_dualpipev_the_theory_of_torchs_sequential_plan() -> None:
    s = summary(ideal_1f1b(4, 8, steps=2), "DualPipeV", 4, 8)
    assert (s["theory_frac"] == 6 / 54).all() and s["measured_frac"].notna().all()


# --- prediction -------------------------------------------------------------------------------


def varying_bubbles() -> pd.DataFrame:
    """Slot 0 of rank 1 over 6 steps lasting 9, 1, 5, 4, 6, 3 ms."""
    durations = [9.0, 1.0, 5.0, 4.0, 6.0, 3.0]
    return pd.DataFrame(
        {
            "step": range(6),
            "rank": 1,
            "slot": 0,
            "label": "A",
            "start_ms": 0.0,
            "end_ms": durations,
            "duration_ms": durations,
        }
    )


def test_predict_bubbles_takes_minimum_over_last_k_steps() -> None:
    p = predict_bubbles(varying_bubbles(), k=4)
    assert p[["rank", "slot", "label", "predicted_ms", "n"]].values.tolist() == [
        [1, 0, "A", 3.0, 4]
    ]


def test_predict_bubbles_percentile_matches_slot_predictor() -> None:
    b = varying_bubbles()
    online = SlotPredictor(k=5, method="percentile", q=25)
    for d in b["duration_ms"]:
        online.observe(0, int(d * 1e6))
    offline = predict_bubbles(b, k=5, method="percentile", q=25)["predicted_ms"].iloc[0]
    assert online.predict(0) == int(offline * 1e6)


def test_predict_bubbles_of_ideal_run_gives_one_row_per_rank_slot() -> None:
    b = extract_bubbles(ideal_1f1b(4, 4, steps=3), schedule="1F1B", stages=4)
    p = predict_bubbles(b)
    assert len(p) == 4 + 5 + 4 + 2 and (p["n"] == 3).all()


def test_slot_predictor_returns_none_for_an_unseen_slot() -> None:
    assert SlotPredictor().predict(3) is None


def test_slot_predictor_forgets_observations_older_than_k() -> None:
    pred = SlotPredictor(k=2)
    for d in (1, 50, 40):
        pred.observe(0, d)
    assert pred.predict(0) == 40


def test_slot_predictor_rejects_negative_duration() -> None:
    with pytest.raises(ValueError, match="duration_ns=-5"):
        SlotPredictor().observe(0, -5)


def test_predictor_rejects_unknown_method_naming_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"'mean'.*'min', 'percentile'"):
        SlotPredictor(method="mean")  # type: ignore[arg-type]


def test_slot_predictor_repr_shows_settings_and_slot_count() -> None:
    pred = SlotPredictor(k=3)
    pred.observe(1, 10)
    assert repr(pred) == "SlotPredictor(k=3, method='min', q=10, slots=1)"


# --- memory -----------------------------------------------------------------------------------


def test_free_memory_is_capacity_minus_peak_reserved_over_steps() -> None:
    reports = pd.DataFrame(
        {
            "rank": [0, 0, 1],
            "step": [0, 1, 0],
            "peak_reserved_bytes": [30, 40, 10],
            "capacity_bytes": [100, 100, 100],
        }
    )
    assert free_memory(reports).values.tolist() == [[0, 100, 40, 60], [1, 100, 10, 90]]


# --- empty and bad inputs ---------------------------------------------------------------------

_EMPTY_ACTIONS = pd.DataFrame(
    {
        c: pd.Series(dtype="int64" if c in ("step", "rank", "stage", "microbatch") else "float64")
        for c in ("step", "rank", "stage", "microbatch", "start_ms", "end_ms")
    }
).assign(action=pd.Series(dtype="str"))


@pytest.mark.parametrize(
    ("fn", "columns"),
    [
        (step_windows, ["step", "start_ms", "end_ms", "duration_ms"]),
        (extract_bubbles, list(BUBBLE_COLUMNS)),
        (bubble_fraction, ["rank", "step", "window_ms", "busy_ms", "idle_ms", "idle_frac"]),
        (
            lambda a: summary(a, "1F1B", 4, 4),
            ["rank", "stage", "measured_frac", "theory_frac", "delta_pts", "largest_gap_ms",
             "n_bubbles"],
        ),
    ],
)  # fmt: skip
def test_empty_actions_give_empty_frames_with_the_schema(
    fn: Callable[[pd.DataFrame], pd.DataFrame], columns: list[str]
) -> None:
    out = fn(_EMPTY_ACTIONS)
    assert out.empty and list(out.columns) == columns


def test_empty_bubbles_keep_their_dtypes() -> None:
    dtypes = extract_bubbles(_EMPTY_ACTIONS).dtypes
    assert (dtypes["slot"], dtypes["duration_ms"]) == (np.dtype("int64"), np.dtype("float64"))


def test_empty_predictions_and_memory_keep_their_columns() -> None:
    p = predict_bubbles(extract_bubbles(_EMPTY_ACTIONS))
    m = free_memory(pd.DataFrame(columns=["rank", "step", "peak_reserved_bytes", "capacity_bytes"]))
    assert list(p.columns) == ["rank", "slot", "label", "predicted_ms", "n"]
    assert list(m.columns) == ["rank", "capacity_bytes", "peak_reserved_bytes", "free_bytes"]


def test_extract_bubbles_names_missing_columns() -> None:
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['microbatch'\]"):
        extract_bubbles(_EMPTY_ACTIONS.drop(columns="microbatch"))


def test_extract_bubbles_rejects_negative_min_ms() -> None:
    with pytest.raises(ValueError, match="min_ms=-1"):
        extract_bubbles(_EMPTY_ACTIONS, min_ms=-1.0)


def test_extract_bubbles_rejects_unknown_schedule_naming_it() -> None:
    with pytest.raises(ValueError, match="'1f2b'"):
        extract_bubbles(_EMPTY_ACTIONS, schedule="1f2b")


def test_extract_bubbles_rejects_stages_below_a_recorded_stage() -> None:
    with pytest.raises(ValueError, match="stages=3 but actions hold stage 3"):
        extract_bubbles(ideal_1f1b(4, 4), schedule="1F1B", stages=3)


# --- the complete table: step boundaries and the optimizer ------------------------------------


def optimizer_after(a: pd.DataFrame, *, wait_ms: float = 0.5, run_ms: float = 1.0) -> pd.DataFrame:
    """A steps table whose optimizer starts ``wait_ms`` after the rank's last action."""
    last = a.groupby(["step", "rank"])["end_ms"].max().reset_index()
    return pd.DataFrame(
        {
            "step": last["step"],
            "rank": last["rank"],
            "optimizer_start_ms": last["end_ms"] + wait_ms,
            "optimizer_end_ms": last["end_ms"] + wait_ms + run_ms,
        }
    )


def test_idle_between_two_steps_is_a_boundary_bubble_of_the_step_it_follows() -> None:
    a = ideal_1f1b(2, 2, steps=2, step_gap_ms=5.0)
    w = step_windows(a).set_index("step")
    b = extract_bubbles(a, steps=optimizer_after(a))
    boundary = b[(b["kind"] == "boundary") & (b["step"] == 0)]
    assert set(boundary["rank"]) == {0, 1}
    assert (boundary["start_ms"] >= w.loc[0, "end_ms"]).all()
    assert (boundary.groupby("rank")["end_ms"].max() == w.loc[1, "start_ms"]).all()
    in_window = b[(b["kind"] != "boundary") & (b["step"] == 0)]
    assert (boundary.groupby("rank")["slot"].min() > in_window.groupby("rank")["slot"].max()).all()
    # the last step has no next window: it ends with the rank's optimizer (rank 0 idles from
    # the window end to its optimizer; rank 1's optimizer ran inside the window)
    last = b[(b["kind"] == "boundary") & (b["step"] == 1)]
    assert last[["rank", "start_ms", "end_ms"]].values.tolist() == [
        [0, w.loc[1, "end_ms"], w.loc[1, "end_ms"] + 0.5]
    ]


def test_the_optimizer_is_busy_time_even_inside_the_window() -> None:
    a = ideal_1f1b(2, 2, steps=2, step_gap_ms=5.0)
    steps = optimizer_after(a)  # rank 1 finishes first: its optimizer runs inside the window
    b = extract_bubbles(a, steps=steps).query("step == 0 and rank == 1 and kind == 'end'")
    opt = steps.query("step == 0 and rank == 1").iloc[0]
    assert b[["after", "before"]].values.tolist() == [["1B1", "optimizer"], ["optimizer", ""]]
    assert b["end_ms"].iloc[0] == opt["optimizer_start_ms"]
    assert b["start_ms"].iloc[1] == opt["optimizer_end_ms"]


def test_without_steps_the_table_keeps_to_the_windows() -> None:
    a = ideal_1f1b(2, 2, steps=2, step_gap_ms=5.0)
    assert "boundary" not in set(extract_bubbles(a)["kind"])


def test_boundary_bubbles_after_stage_0_are_labelled_a() -> None:
    a = ideal_1f1b(3, 3, steps=2)
    b = extract_bubbles(a, steps=optimizer_after(a), schedule="1F1B", stages=3, microbatches=3)
    labels = b[b["kind"] == "boundary"].groupby("rank")["label"].agg(lambda x: set(x.fillna("-")))
    assert labels.to_dict() == {0: {"-"}, 1: {"A"}, 2: {"A"}}


def test_a_step_whose_successor_was_not_recorded_ends_at_its_window_or_optimizer() -> None:
    a = ideal_1f1b(2, 2, steps=3, step_gap_ms=5.0)
    a = a[a["step"] != 1]  # an untimed step (``timed="alternate"``) records no actions
    b = extract_bubbles(a, steps=optimizer_after(a))
    w = step_windows(a).set_index("step")
    # nothing runs on towards step 2: the last bubble is rank 0's wait for its optimizer
    assert b[b["step"] == 0]["end_ms"].max() == w.loc[0, "end_ms"] + 0.5


def test_extract_bubbles_names_missing_steps_columns() -> None:
    with pytest.raises(ValueError, match=r"steps lacks column\(s\) \['optimizer_end_ms'\]"):
        extract_bubbles(
            ideal_1f1b(2, 2),
            steps=pd.DataFrame(columns=["step", "rank", "optimizer_start_ms"]),
        )


@st.composite
def timelines(draw: st.DrawFn) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Actions and a steps table of a few ranks and steps, in µs turned into ms.

    Within a (step, rank) actions may overlap or touch and a rank may record nothing; steps
    may be missing (untimed steps); the optimizer, when there, starts after the rank's last
    action, and the next step starts after everything of this one (the ranks agree on
    stopping in between), as in a run.
    """
    ranks = draw(st.integers(1, 4))
    step_ids = sorted(draw(st.sets(st.integers(0, 6), min_size=1, max_size=4)))
    t = draw(st.integers(0, 1_000))
    acts: list[tuple[int, int, str, int, int, int]] = []
    opts: list[tuple[int, int, float, float]] = []
    for step in step_ids:
        latest = t
        for rank in range(ranks):
            start = t + draw(st.integers(0, 400))
            reach = None
            for mb in range(draw(st.integers(0, 5))):
                duration = draw(st.integers(0, 600))
                acts.append(
                    (step, rank, draw(st.sampled_from("FBIW")), mb, start, start + duration)
                )
                reach = max(reach or 0, start + duration)
                start += draw(st.integers(0, 700))  # below the duration: overlapping actions
            if draw(st.booleans()):
                o0 = (reach if reach is not None else t) + draw(st.integers(0, 300))
                o1 = o0 + draw(st.integers(0, 400))
                opts.append((step, rank, o0, o1))
                latest = max(latest, o1)
            elif draw(st.booleans()):
                opts.append((step, rank, math.nan, math.nan))  # not reported yet
            latest = max(latest, reach or t)
        t = latest + draw(st.integers(0, 1_000))
    a = pd.DataFrame(acts, columns=["step", "rank", "action", "microbatch", "start_ms", "end_ms"])
    a[["start_ms", "end_ms"]] = a[["start_ms", "end_ms"]] / 1e3
    a["stage"] = a["rank"]
    cols = ["step", "rank", "optimizer_start_ms", "optimizer_end_ms"]
    s = pd.DataFrame(opts, columns=cols).astype({"step": "int64", "rank": "int64"})
    s[cols[2:]] = s[cols[2:]].astype("float64") / 1e3
    return a, s


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(timelines())
def test_busy_time_and_bubbles_fill_every_step_exactly_and_never_overlap(
    timeline: tuple[pd.DataFrame, pd.DataFrame],
) -> None:
    actions, steps = timeline
    assume(not actions.empty)
    assert_complete_and_exact(actions, steps, extract_bubbles(actions, steps=steps))


@settings(max_examples=100, deadline=None)
@given(timelines())
def test_without_steps_actions_and_bubbles_fill_each_window_exactly(
    timeline: tuple[pd.DataFrame, pd.DataFrame],
) -> None:
    actions, _ = timeline
    assume(not actions.empty)
    b = extract_bubbles(actions)
    idle = b.groupby(["step", "rank"])["duration_ms"].sum()
    f = bubble_fraction(actions).set_index(["step", "rank"])
    assert np.allclose(idle.reindex(f.index, fill_value=0.0), f["idle_ms"], atol=1e-9)


def test_steps_that_overlap_across_ranks_never_overlap_a_ranks_own_busy_time() -> None:
    """Nothing holds the ranks at a step boundary: rank 0 starts step 1 while rank 1 still runs
    a weight gradient of step 0. Rank 1's step 1 then starts where its step 0 ended, and no
    rank's bubbles cover its own busy time."""
    rows = [  # step, rank, action, microbatch, start, end (ms)
        (0, 0, "F", 0, 0.0, 10.0),
        (0, 1, "F", 0, 10.0, 20.0),
        (0, 1, "W", 0, 20.0, 45.0),
        (0, 0, "B", 0, 25.0, 35.0),
        (1, 0, "F", 0, 40.0, 50.0),  # before rank 1's W of step 0 ends
        (1, 1, "F", 0, 50.0, 60.0),
        (1, 0, "B", 0, 70.0, 80.0),
    ]
    actions = pd.DataFrame(
        rows, columns=["step", "rank", "action", "microbatch", "start_ms", "end_ms"]
    )
    actions["stage"] = actions["rank"]
    steps = pd.DataFrame(
        [(0, 0, 36.0, 38.0), (0, 1, 46.0, 48.0), (1, 0, 81.0, 82.0), (1, 1, 61.0, 62.0)],
        columns=["step", "rank", "optimizer_start_ms", "optimizer_end_ms"],
    )
    bubbles = extract_bubbles(actions, steps=steps)
    assert_complete_and_exact(actions, steps, bubbles)
    mine = bubbles[(bubbles["rank"] == 1) & (bubbles["step"] == 1)]
    first = mine.sort_values("start_ms").iloc[0]
    assert (first["start_ms"], first["end_ms"]) == (48.0, 50.0)  # after its step 0, optimizer
    # rank 0 began step 1 (at 40) before step 0's window closed (45): no boundary bubble
    boundary = bubbles[bubbles["kind"] == "boundary"]
    assert (0, 0) not in set(zip(boundary["step"], boundary["rank"], strict=True))
