"""Side-task limits: validation, environment, what applies where; MPS and GPU caps (GPU only)."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from freeride_lab.core.sidetask_state import SideTaskState
from freeride_lab.gpu.mps import MpsDaemon
from freeride_lab.io.rundir import RunDir
from freeride_lab.sidetasks.edges import EdgeWriter, edge_path
from freeride_lab.sidetasks.limits import (
    GpuLimits,
    env_for,
    limit_support,
    parse_bytes,
    restart_fields,
    support_summary,
)
from freeride_lab.sidetasks.process import TaskProcess, child_env
from freeride_lab.sidetasks.spec import HostSpec, TaskSpec


@pytest.mark.parametrize(
    ("text", "size"),
    [("4GB", 4 * 10**9), ("512MiB", 512 * 2**20), ("3G", 3 * 2**30), ("1.5 GiB", 3 * 2**29)],
)
def test_sizes_parse_with_decimal_and_binary_units(text: str, size: int) -> None:
    assert parse_bytes(text) == size


def test_unknown_unit_is_named_with_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown unit 'XB'; valid: B, KB"):
        parse_bytes("4XB")


def test_negative_memory_is_refused_with_its_value() -> None:
    with pytest.raises(ValueError, match=r"memory size -1 must be a finite number of bytes >= 0"):
        GpuLimits(memory_bytes=-1)


def test_zero_memory_suggests_none_for_no_cap() -> None:
    with pytest.raises(ValueError, match=r"memory_bytes=0 must be > 0; use None"):
        GpuLimits(memory_bytes=0)


@pytest.mark.parametrize("pct", [0, 100.5, -5])
def test_sm_share_outside_0_100_is_refused(pct: float) -> None:
    with pytest.raises(ValueError, match=rf"sm_pct={pct!r} must be in \(0, 100\]"):
        GpuLimits(sm_pct=pct)


def test_nan_is_refused_as_not_finite() -> None:
    with pytest.raises(ValueError, match=r"sm_pct=nan must be a finite number"):
        GpuLimits(sm_pct=math.nan)


def test_priority_other_than_0_or_1_is_refused() -> None:
    with pytest.raises(ValueError, match=r"priority=2 must be 0 \(normal\) or 1"):
        GpuLimits(priority=2)


def test_replace_names_an_unknown_limit_and_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown limit\(s\) 'memory'; valid: memory_bytes"):
        GpuLimits().replace(memory="1GB")


def test_limits_round_trip_through_dicts() -> None:
    limits = GpuLimits.from_dict({"memory_bytes": "2GiB", "sm_pct": 25, "budget_s": 0.048})
    assert GpuLimits.from_dict(limits.to_dict()) == limits


def test_mps_environment_carries_every_limit() -> None:
    limits = GpuLimits(memory_bytes=parse_bytes("3G"), sm_pct=25)
    env = env_for(limits, mps_active=True, device_index=2)
    assert env["CUDA_MPS_CLIENT_PRIORITY"] == "1"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "2=3072M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


def test_without_mps_no_mps_variable_is_set() -> None:
    env = env_for(GpuLimits(memory_bytes=2**30, sm_pct=25), mps_active=False, device_index=0)
    assert not any(k.startswith("CUDA_MPS") for k in env)
    assert env["FREERIDE_MEMORY_BYTES"] == str(2**30)


def test_cpu_summary_says_gpu_limits_do_not_apply() -> None:
    assert (
        support_summary(device="cpu", mps_active=False)
        == "cpu: memory cap via RLIMIT_AS; SM share and priority do not apply"
    )
    assert limit_support(device="cpu", mps_active=False)["sm_pct"] == "does not apply on cpu"


def test_memory_and_sm_changes_need_a_restart_but_the_budget_does_not() -> None:
    old = GpuLimits(budget_s=0.05)
    assert restart_fields(old, old.replace(budget_s=0.1)) == ()
    assert restart_fields(old, old.replace(memory_bytes=2**30, sm_pct=50)) == (
        "memory_bytes",
        "sm_pct",
    )


def test_mps_is_unavailable_without_a_gpu_and_says_why() -> None:
    availability = MpsDaemon.available()
    if availability:
        pytest.skip("this machine has a GPU and the MPS binaries")
    assert not availability and availability.reason


# --- GPU only -----------------------------------------------------------------------------


@pytest.fixture
def mps(tmp_path: Path) -> Iterator[MpsDaemon]:
    availability = MpsDaemon.available()
    if not availability:
        pytest.skip(f"MPS unavailable: {availability.reason}")
    daemon = MpsDaemon(tmp_path / "mps-pipe", tmp_path / "mps-log")
    daemon.start()
    yield daemon
    daemon.stop()


@pytest.mark.gpu
def test_mps_daemon_starts_answers_and_stops(mps: MpsDaemon) -> None:
    assert mps.is_running()
    mps.stop()
    assert not mps.is_running()
    mps.stop()  # idempotent


@pytest.mark.gpu
def test_mps_client_under_a_pinned_cap_runs_out_of_memory_alone(mps: MpsDaemon) -> None:
    code = textwrap.dedent(
        """
        import torch
        x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # within the cap
        try:
            y = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")  # over it
        except torch.OutOfMemoryError:
            print("oom")
        else:
            print("no oom")
        """
    )
    cap = env_for(GpuLimits(memory_bytes=2**30), mps_active=True, device_index=0)
    env = child_env({**mps.client_env(), **cap})
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.stdout.strip() == "oom", out.stderr[-2000:]


@pytest.mark.gpu
def test_task_allocating_over_its_cap_fails_out_of_memory_in_its_own_process(
    tmp_path: Path,
) -> None:
    run = RunDir(tmp_path / "run")
    run.create()
    hog = tmp_path / "gpu_hog.py"
    hog.write_text(
        textwrap.dedent(
            """
            import torch
            from freeride_lab.sidetasks.api import IterativeSideTask

            class GpuHog(IterativeSideTask):
                def setup(self):
                    self.kept = []

                def step(self):
                    self.kept.append(torch.empty(512 << 20, dtype=torch.uint8, device=self.device))
                    return 1.0
            """
        )
    )
    writer = EdgeWriter.create(edge_path(run.path, 0))
    limits = {"memory_bytes": "2GiB", "budget_s": 0.001}
    spec = TaskSpec.from_dict({"task": f"{hog}:GpuHog", "task_id": "hog", "limits": limits})
    proc = TaskProcess(spec)
    proc.start(
        HostSpec(task=spec, run_dir=str(run.path), rank=0, stage=0, device="cuda:0"),
        log_path=run.logs_dir / "task-hog.log",
    )
    deadline = time.monotonic() + 300
    activated = False
    while proc.alive and time.monotonic() < deadline:
        if proc.state is SideTaskState.CREATED and not activated:
            activated = proc.send({"cmd": "activate"})
        if proc.conn is not None and proc.conn.poll(0.05):
            proc.receive()
        now = time.time_ns()
        writer.bubble_start(0, 0, now, now + 10**9)  # one long bubble after another
    assert proc.proc is not None and proc.proc.wait(60) == 1
    lines = (run.events_dir / "task-hog.jsonl").read_text().splitlines()
    assert '"state":"FAILED"' in lines[-1] and "out of memory" in lines[-1]
