"""GPU monitor and NVML layer: no-NVML path on this machine, rendering from fake samples."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import pytest

from freeride_lab.gpu import nvml
from freeride_lab.gpu.nvml import (
    GpuSample,
    NvmlSampler,
    map_cuda_visible_devices,
    samples_frame,
)
from freeride_lab.ui.gpu_monitor import GpuMonitor, ProcessRole, memory_split, render_html

GIB = 1024**3
UUIDS = ["GPU-aaaa-1111", "GPU-bbbb-2222", "GPU-cccc-3333", "GPU-dddd-4444"]
ROLES = {
    100: ProcessRole("training", "rank 0"),
    200: ProcessRole("side_task", "<b>resnet18</b> (t1)"),
}


def sample(index: int = 0, **changes) -> GpuSample:
    values = dict(
        index=index,
        t_ns=1,
        utilization_pct=87.0,
        memory_used_bytes=30.0 * GIB,
        memory_total_bytes=80.0 * GIB,
        power_w=310.0,
        sm_clock_mhz=1980.0,
        processes=((100, 20 * GIB), (200, 6 * GIB), (999, 1 * GIB)),
        cuda_ordinal=index,
    )
    values.update(changes)
    return GpuSample(**values)


needs_no_nvml = pytest.mark.skipif(nvml.is_available(), reason="this machine has NVML")


@needs_no_nvml
def test_without_nvml_nothing_raises_and_a_reason_is_given():
    assert nvml.device_count() == 0
    assert nvml.read_samples() == []
    assert "CPU run" in nvml.unavailable_reason()


@needs_no_nvml
def test_query_returns_the_default_without_nvml():
    assert math.isnan(nvml.query("nvmlDeviceGetCount"))
    assert nvml.query("nvmlDeviceGetCount", default=0) == 0


@needs_no_nvml
def test_the_power_cap_is_read_in_watts_and_none_without_nvml(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(nvml, "is_available", lambda: False)
    assert nvml.power_limit_w() is None
    answers = {"nvmlDeviceGetHandleByIndex": "gpu0", "nvmlDeviceGetEnforcedPowerLimit": 700_000}
    monkeypatch.setattr(nvml, "is_available", lambda: True)
    monkeypatch.setattr(nvml, "query", lambda name, *args, default=None: answers[name])
    assert nvml.power_limit_w() == 700.0


def test_sampler_without_nvml_starts_no_thread():
    sampler = NvmlSampler().start()
    assert not sampler.running
    assert "CPU run" in sampler.reason
    sampler.stop()


@needs_no_nvml
def test_monitor_without_nvml_shows_cpu_run_notice():
    mon = GpuMonitor().start()
    assert "no GPU — CPU run" in mon.widget.value
    mon.stop()


def test_unset_cuda_visible_devices_maps_identity():
    assert map_cuda_visible_devices(None, UUIDS) == {0: 0, 1: 1, 2: 2, 3: 3}


def test_cuda_visible_devices_reorders_by_index():
    assert map_cuda_visible_devices("2,0", UUIDS) == {0: 2, 1: 0}


def test_cuda_visible_devices_accepts_uuid_prefixes():
    assert map_cuda_visible_devices("GPU-dddd,bbbb-2222", UUIDS) == {0: 3, 1: 1}


def test_cuda_visible_devices_stops_at_first_invalid_entry():
    assert map_cuda_visible_devices("1,7,2", UUIDS) == {0: 1}
    assert map_cuda_visible_devices("", UUIDS) == {}
    assert map_cuda_visible_devices("-1", UUIDS) == {}


def test_ambiguous_uuid_prefix_maps_nothing():
    assert map_cuda_visible_devices("GPU-", UUIDS) == {}


def test_sampler_keeps_a_bounded_ring_of_fake_samples():
    sampler = NvmlSampler(capacity=3, reader=lambda: [sample(0), sample(1)])
    for _ in range(3):
        sampler.tick()
    assert len(sampler.samples()) == 3
    assert sorted(sampler.latest()) == [0, 1]
    assert sampler.ticks == 3


def test_sampler_thread_calls_on_tick_and_stops_idempotently():
    ticked = threading.Event()
    sampler = NvmlSampler(
        interval_s=0.05, reader=lambda: [sample()], on_tick=lambda s: ticked.set()
    )
    with sampler:
        assert ticked.wait(timeout=30), "sampler never ticked"
    sampler.stop()
    assert not sampler.running


def test_sampler_rejects_nonpositive_interval():
    with pytest.raises(ValueError, match="interval_s=0"):
        NvmlSampler(interval_s=0)


def test_samples_frame_has_unit_suffixed_float_columns():
    frame = samples_frame([sample(0), sample(1, power_w=math.nan)])
    assert list(frame.columns) == nvml.SAMPLE_COLUMNS
    assert frame["power_w"].isna().sum() == 1
    assert frame["memory_used_bytes"].dtype == "float64"


def test_memory_split_separates_training_side_tasks_and_other():
    split = memory_split(sample(), ROLES)
    assert (split.training_bytes, split.side_task_bytes) == (20 * GIB, 6 * GIB)
    assert split.other_bytes == 4 * GIB  # unknown pid 999 + unattributed
    assert split.free_bytes == 50 * GIB


def test_memory_split_is_nan_when_nvml_could_not_read_memory():
    split = memory_split(sample(memory_used_bytes=math.nan), ROLES)
    assert math.isnan(split.other_bytes) and math.isnan(split.free_bytes)


def test_render_shows_utilisation_memory_power_per_gpu():
    page = render_html([sample(1), sample(0)], ROLES)
    assert page.index("GPU 0 (cuda:0)") < page.index("GPU 1 (cuda:1)")
    assert "87 %" in page and "310 W" in page and "30.0 GiB / 80.0 GiB" in page
    assert "training 20.0 GiB" in page and "side 6.0 GiB" in page


def test_render_escapes_role_labels():
    page = render_html([sample()], ROLES)
    assert "<b>resnet18</b>" not in page
    assert "&lt;b&gt;resnet18&lt;/b&gt; (t1)" in page


def test_render_marks_unknown_processes():
    assert "not part of this run" in render_html([sample()], ROLES)


def test_render_shows_dashes_for_unreadable_values():
    page = render_html([sample(power_w=math.nan, utilization_pct=math.nan)])
    assert "- W" in page and "- %" in page


def test_monitor_redraws_on_each_changed_tick_only():
    mon = GpuMonitor(NvmlSampler(reader=lambda: [sample()]), roles=ROLES).start()
    widget = mon.widget
    mon.sampler.stop()
    mon.sampler.tick()
    mon.sampler.tick()
    assert mon.redraws == 1
    assert "310 W" in widget.value
    mon.stop()


def test_set_roles_redraws_with_new_roles():
    mon = GpuMonitor(NvmlSampler(reader=lambda: [sample()]))
    mon.update([sample()])
    assert "rank 0" not in mon.html
    mon.set_roles(ROLES)
    assert "rank 0" in mon.html


class FakeNvml:
    """Just enough of pynvml for two GPUs; power fails on GPU 1 like an unsupported board."""

    NVML_CLOCK_SM = 1

    class NVMLError(Exception):
        pass

    class Handle:
        def __init__(self, index: int) -> None:
            self.index = index

    class Util:
        gpu = 55

    class Mem:
        used, total = 10 * GIB, 40 * GIB

    class Proc:
        def __init__(self, pid: int, used: int | None) -> None:
            self.pid, self.usedGpuMemory = pid, used

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.Handle(index)

    def nvmlDeviceGetUUID(self, handle):
        return UUIDS[handle.index]

    def nvmlDeviceGetUtilizationRates(self, handle):
        return self.Util()

    def nvmlDeviceGetMemoryInfo(self, handle):
        return self.Mem()

    def nvmlDeviceGetPowerUsage(self, handle):
        if handle.index == 1:
            raise self.NVMLError("Not Supported")
        return 250_000  # mW

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return 1410

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [self.Proc(100, 4 * GIB), self.Proc(101, None)]


@pytest.fixture
def fake_nvml(monkeypatch):
    state = nvml._State()
    state.tried, state.module = True, FakeNvml()
    monkeypatch.setattr(nvml, "_STATE", state)
    return state


def test_read_samples_fills_one_sample_per_gpu(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    first, second = nvml.read_samples()
    assert (first.utilization_pct, first.memory_used_bytes, first.power_w) == (
        55.0,
        10 * GIB,
        250.0,
    )
    assert first.processes == ((100, 4 * GIB), (101, 0))
    assert (first.cuda_ordinal, second.cuda_ordinal) == (None, 0)


def test_failing_nvml_call_gives_nan_and_warns_once(fake_nvml, caplog):
    nvml.read_samples()
    samples = nvml.read_samples()
    assert math.isnan(samples[1].power_w)
    warnings = [r for r in caplog.records if "nvmlDeviceGetPowerUsage" in r.getMessage()]
    assert len(warnings) == 1


def test_missing_nvml_function_gives_default(fake_nvml):
    assert nvml.query("nvmlDeviceGetFutureThing", default=None) is None
    assert nvml.is_available()


# -- history (sparklines) ------------------------------------------------------------------------


def ticking_reader(utilisations: list[float], gpus: int = 2) -> Callable[[], list[GpuSample]]:
    """A fake NVML reader: each call is one tick later and reads the next utilisation."""
    ticks = iter(range(1, 10_000))

    def read() -> list[GpuSample]:
        t = next(ticks)
        util = utilisations[(t - 1) % len(utilisations)]
        return [sample(i, t_ns=t, utilization_pct=util) for i in range(gpus)]

    return read


def test_monitor_keeps_a_bounded_history_per_gpu_from_a_fake_sampler():
    mon = GpuMonitor(NvmlSampler(reader=ticking_reader([10.0, 50.0, 90.0, 40.0])), history_len=3)
    for _ in range(5):  # five ticks of the sampler, by hand
        mon.update(mon.sampler.tick())
    assert sorted(mon.history) == [0, 1]
    assert [s.utilization_pct for s in mon.history[0]] == [90.0, 40.0, 10.0]  # the last 3


def test_each_gpu_shows_sparklines_of_sm_memory_power_and_clock():
    mon = GpuMonitor(NvmlSampler(reader=ticking_reader([10.0, 90.0, 40.0])), history_len=10)
    for _ in range(3):
        mon.update(mon.sampler.tick())
    page = mon.html
    assert page.count('class="fr-spark"') == 4 * 2  # four metrics, two GPUs
    for title in ("SM utilisation", "memory used", "power", "SM clock"):
        assert f'aria-label="{title}: ' in page
    assert 'aria-label="SM utilisation: 10 to 90 % over the last 3 readings"' in page
    assert "<th>utilisation</th>" not in page  # the snapshot table is gone


def test_a_repeated_reading_adds_nothing_to_the_history():
    mon = GpuMonitor(NvmlSampler(reader=lambda: [sample()]))
    mon.update([sample()])
    mon.update([sample()])
    assert len(mon.history[0]) == 1


def test_an_unreadable_value_breaks_the_sparkline_instead_of_drawing_zero():
    from freeride_lab.ui.sparkline import sparkline_svg

    svg = sparkline_svg([10.0, 20.0, math.nan, 30.0, 40.0], low=0, high=100, label="x")
    assert svg.count("<polyline") == 2


def test_history_shorter_than_two_readings_is_refused():
    with pytest.raises(ValueError, match="history_len=1"):
        GpuMonitor(NvmlSampler(reader=lambda: []), history_len=1)
