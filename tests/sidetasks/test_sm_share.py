"""``gpu.sm_share``: a share of the SMs inside the running process (CUDA green contexts)."""

from __future__ import annotations

import time

import pytest

from freeride_lab.gpu.sm_share import SM_GRANULE, SmShare, sm_count_for


@pytest.mark.parametrize(
    ("pct", "total", "count"),
    [(25, 132, 32), (30, 132, 40), (1, 132, 8), (100, 132, 132), (99, 132, 128), (50, 16, 8)],
)
def test_a_share_is_whole_granules_of_sms_within_the_device(
    pct: float, total: int, count: int
) -> None:
    got = sm_count_for(pct, total)
    assert got == count
    assert got == total or got % SM_GRANULE == 0


@pytest.mark.parametrize("pct", [0, -1, 101])
def test_a_share_outside_0_100_is_refused(pct: float) -> None:
    with pytest.raises(ValueError, match=rf"pct={pct!r} must be in \(0, 100\]"):
        sm_count_for(pct, 132)


def test_a_cpu_task_gets_no_share_and_the_reason() -> None:
    share, why = SmShare.create("cpu", 25)
    assert share is None
    assert "needs a CUDA device" in why


@pytest.mark.gpu
def test_work_on_a_quarter_of_the_sms_takes_longer_and_the_device_comes_back() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    share, why = SmShare.create("cuda:0", 25)
    if share is None:
        pytest.skip(why)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def matmul_s() -> float:
        a @ a  # warm
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()
        return time.perf_counter() - start

    whole = matmul_s()
    with share.active():
        quarter = matmul_s()
    again = matmul_s()
    assert share.num_sms < share.total_sms
    assert quarter > 2 * whole  # a quarter of the SMs: far slower (not a timing bound)
    assert again < quarter / 2  # popping the context gives the whole device back
