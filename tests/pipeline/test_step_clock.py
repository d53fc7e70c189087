"""The step clock: stamps on the run clock, handed out once readable, never waiting."""

from __future__ import annotations

import time

import pytest
import torch

from freeride_lab.pipeline.step_clock import StepClock


def test_on_cpu_a_deferred_step_is_ready_at_once_on_the_run_clock() -> None:
    clock = StepClock("cpu", clock_offset_ns=5_000_000_000)
    before = time.time_ns()
    start = clock.begin_step()
    end = clock.stamp()
    clock.defer(end, lambda resolve: (resolve(start), resolve(end)))
    [(start_ns, end_ns)] = clock.ready()
    assert before + 5_000_000_000 <= start_ns <= end_ns <= time.time_ns() + 5_000_000_000
    assert clock.pending == 0 and clock.ready() == [] and clock.flush() == []


def test_steps_are_handed_out_in_order() -> None:
    clock = StepClock("cpu")
    for step in range(3):
        first = clock.begin_step()
        clock.defer(first, lambda resolve, step=step: step)
    assert clock.ready() == [0, 1, 2]


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
def test_a_step_still_running_on_the_device_is_not_waited_for_and_flush_waits() -> None:
    clock = StepClock("cuda")
    start = clock.begin_step()
    torch.cuda._sleep(200_000_000)  # the device is busy for ~0.1 s
    end = clock.stamp()
    clock.defer(end, lambda resolve: resolve(end) - resolve(start))
    t0 = time.monotonic()
    assert clock.ready() == []  # not done yet, and the host did not wait
    assert time.monotonic() - t0 < 0.05
    [span_ns] = clock.flush()
    assert span_ns > 10_000_000


@pytest.mark.gpu
@cuda
def test_cuda_stamps_land_on_the_host_clock_within_their_step() -> None:
    clock = StepClock("cuda")
    host_start = clock.now_ns()
    start = clock.begin_step()
    torch.cuda._sleep(50_000_000)
    end = clock.stamp()
    clock.defer(end, lambda resolve: (resolve(start), resolve(end)))
    [(start_ns, end_ns)] = clock.flush()
    host_end = clock.now_ns()
    assert host_start - 200_000 <= start_ns < end_ns <= host_end + 200_000


@pytest.mark.gpu
@cuda
def test_an_event_another_thread_holds_is_never_recycled_and_the_rest_are() -> None:
    clock = StepClock("cuda")
    clock.begin_step()
    held = clock.stamp()
    clock.hold(held)
    last = clock.stamp()
    clock.defer(last, lambda resolve: resolve(last))
    clock.flush()
    assert all(e is not held for e in clock._free) and any(e is last for e in clock._free)
    clock.release(held)
    clock.begin_step()
    clock.defer(clock.stamp(), lambda resolve: None)
    clock.flush()
    assert all(e is not held for e in clock._free)  # dropped, not reused later
