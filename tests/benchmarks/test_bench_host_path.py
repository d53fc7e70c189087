"""The host-path benchmark: a real task host in one process, one step per bubble."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_scripts import load_script


def test_each_bubble_gets_one_step_and_its_start_is_stamped_before_the_call(
    tmp_path: Path,
) -> None:
    bench = load_script("bench_host_path")
    figures = bench.measure(200, 5, tmp_path)
    assert figures["bubbles"] == 200
    call, start = figures["edge_to_call_us"], figures["edge_to_recorded_start_us"]
    assert (call["blocks"], call["per_block"]) == (5, 40)
    for q in ("p50", "p90"):
        assert 0 < start[q]["value"] <= call[q]["value"]  # the start comes right before the call
        assert call[q]["lo"] <= call[q]["value"] <= call[q]["hi"]


def test_between_steps_every_bubble_gets_its_steps_and_each_gap_is_timed(
    tmp_path: Path,
) -> None:
    bench = load_script("bench_host_path")
    figures = bench.measure_between(50, 6, 5, tmp_path)
    gaps = figures["between_steps_us"]
    assert figures["steps_per_bubble"] == 6
    assert (gaps["blocks"], gaps["per_block"]) == (5, 50)  # five gaps in each of 50 bubbles
    for q in ("p50", "p90"):
        assert 0 < gaps[q]["lo"] <= gaps[q]["value"] <= gaps[q]["hi"]
    with pytest.raises(SystemExit, match="two steps"):
        bench.measure_between(50, 1, 5, tmp_path)
    with pytest.raises(SystemExit, match="at least 5 blocks"):
        bench.measure_between(50, 6, 4, tmp_path)


def test_an_interval_needs_five_blocks(tmp_path: Path) -> None:
    bench = load_script("bench_host_path")
    with pytest.raises(SystemExit, match="at least 5 blocks"):
        bench.measure(100, 4, tmp_path)


def test_edge_latency_blocks_give_each_figure_an_interval() -> None:
    bench = load_script("bench_edge_latency")
    starts = [10.0] * 50 + [30.0] * 50 + [100.0] * 100  # the first tenth is left out by callers
    out = bench._block_means(starts, 5)
    assert (out["blocks"], out["starts_per_block"]) == (5, 40)
    assert out["no_wake_frac"]["value"] == pytest.approx((1 + 0.25) / 5)
    assert out["p50_us"]["lo"] <= out["p50_us"]["value"] <= out["p50_us"]["hi"]


def test_a_cold_path_sleeps_and_spins_before_each_bubble_and_times_the_host_alone(
    tmp_path: Path,
) -> None:
    bench = load_script("bench_host_path")
    figures = bench.measure(100, 5, tmp_path, idle_s=0.001, spin_s=0.0005)
    assert (figures["idle_ms"], figures["spin_ms"]) == (1.0, 0.5)
    alone, call = figures["visible_to_call_us"], figures["edge_to_call_us"]
    assert (alone["blocks"], alone["per_block"]) == (5, 20)
    for q in ("p50", "p90"):
        assert 0 < alone[q]["value"] < call[q]["value"]  # the publication's write left out


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_an_idle_or_spin_that_is_not_a_finite_time_is_a_usage_error(
    value: str, tmp_path: Path
) -> None:
    """Not a sleep that never ends (inf) or a ValueError halfway through (nan): one error."""
    bench = load_script("bench_host_path")
    for flag in ("--idle-ms", "--spin-ms"):
        with pytest.raises(SystemExit) as stop:
            bench.main([flag, value, "--bubbles", "10", "--out", str(tmp_path / "o.json")])
        assert stop.value.code == 2
    assert not (tmp_path / "o.json").exists()
