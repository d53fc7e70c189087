"""Claims about clock alignment, on two real gloo processes with a known clock shift.

Rank 1 reads a clock shifted by a known amount from the host clock, so the true offset to rank
0 (the run clock) is known exactly; the estimate must land within the uncertainty it reports.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from freeride_lab.pipeline.clock import sync_clock

TIMEOUT_S = 120
SLACK_NS = 1_000  # clock reads and integer halving; the bound itself is exact


class ShiftedClock:
    """``time.time_ns`` shifted by ``shift_ns``. Every other read (the first of each pair) can
    be slow: ``late_s`` before reading (a rank descheduled between leaving a barrier and reading
    its clock) or ``hold_s`` after it (a slow request leg: the two legs of a round trip differ).
    """

    def __init__(self, shift_ns: int, *, late_s: float = 0.0, hold_s: float = 0.0) -> None:
        self.shift_ns = shift_ns
        self.late_s = late_s
        self.hold_s = hold_s
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        odd = self.calls % 2 == 1
        if odd and self.late_s:
            time.sleep(self.late_s)
        now = time.time_ns() + self.shift_ns
        if odd and self.hold_s:
            time.sleep(self.hold_s)
        return now


def _rank_main(rank: int, store_path: str, out_dir: str, clocks: dict[int, Any]) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    try:
        clock: Callable[[], int] = clocks.get(rank, time.time_ns)
        sync = sync_clock(rounds=8, clock=clock)
        result = {
            "offset_ns": sync.offset_ns,
            "uncertainty_ns": sync.uncertainty_ns,
            "rtt_ns": sync.rtt_ns,
            "measured_offset_ns": sync.measured_offset_ns,
            "same_host": sync.same_host,
        }
        Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def align(tmp_path: Path, clocks: dict[int, Any]) -> dict[int, dict[str, Any]]:
    """Run ``sync_clock`` on two spawned gloo ranks; each rank's ``ClockSync`` as a dict."""
    ctx = mp.get_context("spawn")
    store = tmp_path / "store"
    procs = [
        ctx.Process(target=_rank_main, args=(r, str(store), str(tmp_path), clocks)) for r in (0, 1)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(TIMEOUT_S)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert [p.exitcode for p in procs] == [0, 0]
    return {r: json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)}


@pytest.mark.parametrize(
    "clock",
    [
        ShiftedClock(3_700_000_123),
        ShiftedClock(-45_000_000_017),
        ShiftedClock(250_000_000, late_s=0.02),
        ShiftedClock(-250_000_000, hold_s=0.02),
    ],
    ids=["ahead", "behind", "late-reader", "slow-request-leg"],
)
def test_offset_estimate_is_within_its_reported_uncertainty_of_an_injected_shift(
    tmp_path: Path, clock: ShiftedClock
) -> None:
    shift_ns = clock.shift_ns
    got = align(tmp_path, {1: clock})
    r1 = got[1]
    true_offset = -shift_ns  # run time = rank 1's clock - shift
    assert not r1["same_host"]  # a shifted clock is not the kernel's: it is measured
    assert r1["uncertainty_ns"] == (r1["rtt_ns"] + 1) // 2 > 0
    assert abs(r1["offset_ns"] - true_offset) <= r1["uncertainty_ns"] + SLACK_NS, r1
    assert got[0]["offset_ns"] == 0 and got[0]["uncertainty_ns"] == 0


def test_ranks_on_one_host_share_the_clock_exactly_and_measure_about_zero(
    tmp_path: Path,
) -> None:
    got = align(tmp_path, {})
    r1 = got[1]
    assert r1["same_host"] and r1["offset_ns"] == 0 and r1["uncertainty_ns"] == 0
    assert abs(r1["measured_offset_ns"]) <= (r1["rtt_ns"] + 1) // 2 + SLACK_NS, r1


def test_sync_clock_rejects_zero_rounds() -> None:
    with pytest.raises(ValueError, match="rounds=0"):
        sync_clock(rounds=0)
