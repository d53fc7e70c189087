"""``GpuLimits``: what a side task may use, and how each limit is enforced on this machine.

    >>> GpuLimits(memory_bytes="4GiB", sm_pct=50).memory_bytes
    4294967296
    >>> env_for(GpuLimits(memory_bytes="512MiB", sm_pct=25), mps_active=True, device_index=1)
    {'CUDA_MPS_CLIENT_PRIORITY': '1', 'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT': '1=512M', \
'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': '25', 'FREERIDE_MEMORY_BYTES': '536870912'}
    >>> support_summary(device="cpu", mps_active=False)
    'cpu: memory cap via RLIMIT_AS; SM share and priority do not apply'

Enforcement (paper notes §11; pipelining-and-gpu.md §8):

- **MPS daemon serving the run:** the worker starts the task process with
  ``CUDA_MPS_CLIENT_PRIORITY`` (1 = below normal), ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` and
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``. CUDA reads them once, when the process initialises it,
  so a change needs a new process (``restart_fields``).
- **CUDA without MPS:** the task host calls ``torch.cuda.set_per_process_memory_fraction`` before
  the first allocation. It caps only PyTorch's caching allocator (not the CUDA context, not
  non-PyTorch allocations); the SM share and the priority have no equivalent.
- **CPU:** the task host caps its address space with ``RLIMIT_AS`` at its start-up footprint
  plus ``memory_bytes``; SM share and priority do not apply.

``FREERIDE_MEMORY_BYTES`` (and ``FREERIDE_SM_PCT``/``FREERIDE_PRIORITY``) carry the limits to the
task host in every case, so it can apply the in-process fallback and report what holds.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import resource
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GpuLimits",
    "apply_in_process",
    "env_for",
    "limit_support",
    "parse_bytes",
    "restart_fields",
    "support_summary",
]

#: Unit → bytes. Bare K/M/G/T are binary, as in CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("3G").
_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")

#: Largest size a cap can carry (RLIMIT_AS and CUDA's sizes are 64-bit).
_MAX_BYTES = 2**63

#: Limits CUDA (or the task host) reads only when the task process starts.
_RESTART_FIELDS = ("memory_bytes", "sm_pct", "priority")


def parse_bytes(value: int | float | str) -> int:
    """Bytes from an int or a size string: "4GB" (10^9), "512MiB" (2^20), "3G" (2^30).

    Raises:
        ValueError: unparsable text, an unknown unit, or a negative or non-finite size.
        TypeError: not an int, float or str.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"memory size {value!r} must be an int of bytes or a string like '4GiB'")
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match is None:
            raise ValueError(
                f"memory size {value!r} is not a number with a unit; write e.g. '4GiB'"
            )
        number, unit = float(match.group(1)), match.group(2).lower()
        if unit not in _UNITS:
            valid = ", ".join(
                u for u in ("B", "KB", "MB", "GB", "KiB", "MiB", "GiB", "K", "M", "G")
            )
            raise ValueError(
                f"memory size {value!r} has unknown unit {match.group(2)!r}; valid: {valid}"
            )
        size = number * _UNITS[unit]
    else:
        size = float(value)
    if not math.isfinite(size) or size < 0:
        raise ValueError(f"memory size {value!r} must be a finite number of bytes >= 0")
    if size >= _MAX_BYTES:
        raise ValueError(
            f"memory size {value!r} is {size:.3g} bytes, more than any device holds (at most "
            "2**63 - 1); give the cap in the device's range, or None for no memory cap"
        )
    return int(size)


@dataclass(frozen=True, kw_only=True)
class GpuLimits:
    """Limits of one side task. ``None`` means "no limit" (or, for ``budget_s``, "profile it").

    Args:
        memory_bytes: device-memory cap; also accepts a size string ("4GiB", "512MiB", "3G").
        sm_pct: share of the GPU's SMs, 0 < pct <= 100 (MPS active-thread percentage).
        priority: MPS client priority, 0 normal or 1 below normal (side tasks default to 1);
            also the order of the stage's queue (``core.task_queue``: 0 preempts 1).
        budget_s: the step guard; a step starts only if the bubble has more than this left.
            None lets the task host derive it from its own step times (paper notes §9).
        trickle_duty: a task attached with gating "trickle" may also step between bubbles,
            through training's compute, for this share of that time (0 = bubbles only, 1 =
            continuously); the overhead governor sets it (``core.governor``).
    """

    memory_bytes: int | None = None
    sm_pct: float | None = None
    priority: int = 1
    budget_s: float | None = None
    trickle_duty: float = 0.0

    def __post_init__(self) -> None:
        if self.memory_bytes is not None:
            size = parse_bytes(self.memory_bytes)
            if size <= 0:
                raise ValueError(
                    f"memory_bytes={self.memory_bytes!r} must be > 0; use None for no memory cap"
                )
            object.__setattr__(self, "memory_bytes", size)
        if self.sm_pct is not None:
            pct = _number("sm_pct", self.sm_pct)
            if not 0 < pct <= 100:
                raise ValueError(
                    f"sm_pct={self.sm_pct!r} must be in (0, 100] (percent of SMs); "
                    "use None for the whole GPU"
                )
            object.__setattr__(self, "sm_pct", pct)
        if type(self.priority) is not int or self.priority not in (0, 1):  # not bool, not 1.0
            raise ValueError(
                f"priority={self.priority!r} must be 0 (normal) or 1 (below normal, the default "
                "for side tasks); MPS knows no other client priorities"
            )
        if self.budget_s is not None:
            budget = _number("budget_s", self.budget_s)
            if budget <= 0:
                raise ValueError(
                    f"budget_s={self.budget_s!r} must be > 0 seconds; use None to profile it"
                )
            object.__setattr__(self, "budget_s", budget)
        duty = _number("trickle_duty", self.trickle_duty)
        if not 0 <= duty <= 1:
            raise ValueError(
                f"trickle_duty={self.trickle_duty!r} must be in [0, 1] (the share of training's "
                "compute time a trickle task may step; 0 = bubbles only)"
            )
        object.__setattr__(self, "trickle_duty", duty)

    def replace(self, **changes: Any) -> GpuLimits:
        """A copy with ``changes`` applied and validated.

        Raises:
            ValueError: an unknown limit name (the message lists the valid ones) or a bad value.
        """
        names = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(changes) - set(names))
        if unknown:
            raise ValueError(
                f"unknown limit(s) {', '.join(map(repr, unknown))}; valid: {', '.join(names)}"
            )
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (what task specs carry)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> GpuLimits:
        """Rebuild from ``to_dict`` output (None or {} = defaults).

        Raises:
            ValueError: an unknown key or a bad value.
        """
        return cls().replace(**dict(data or {}))


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name}={value!r} must be a number")
    if not math.isfinite(value):
        raise ValueError(f"{name}={value!r} must be a finite number")
    return float(value)


def restart_fields(old: GpuLimits, new: GpuLimits) -> tuple[str, ...]:
    """Names of the limits that differ and can only take effect in a new task process."""
    return tuple(f for f in _RESTART_FIELDS if getattr(old, f) != getattr(new, f))


def env_for(limits: GpuLimits, *, mps_active: bool, device_index: int) -> dict[str, str]:
    """Environment variables that start a task process under ``limits``.

    Args:
        mps_active: an MPS daemon serves this run (its pipe/log directories come from
            ``MpsDaemon.client_env()``, not from here).
        device_index: the CUDA ordinal of the task's GPU as the task process sees it.
    """
    env: dict[str, str] = {}
    if mps_active:
        env["CUDA_MPS_CLIENT_PRIORITY"] = str(limits.priority)
        if limits.memory_bytes is not None:
            # Whole MiB, rounded down: if MPS reads "M" as 10^6 bytes the cap is only tighter.
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"{device_index}={limits.memory_bytes >> 20}M"
        if limits.sm_pct is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = f"{limits.sm_pct:g}"
    if limits.memory_bytes is not None:
        env["FREERIDE_MEMORY_BYTES"] = str(limits.memory_bytes)
    if limits.sm_pct is not None and not mps_active:
        env["FREERIDE_SM_PCT"] = f"{limits.sm_pct:g}"
    return env


#: The limits the task host itself enforces, wherever it runs.
_HOST_ENFORCED = {
    "budget_s": "step guard in the task host",
    "trickle_duty": 'pacing of steps between bubbles in the task host (gating "trickle")',
}


def limit_support(*, device: str, mps_active: bool) -> dict[str, str]:
    """For each limit, how it is enforced on ``device`` or why it does not apply."""
    if device.startswith("cuda"):
        if mps_active:
            return {
                "memory_bytes": "MPS pinned device memory limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)",
                "sm_pct": "MPS active thread percentage (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)",
                "priority": "MPS client priority (CUDA_MPS_CLIENT_PRIORITY)",
                **_HOST_ENFORCED,
            }
        return {
            "memory_bytes": (
                "torch.cuda.set_per_process_memory_fraction (PyTorch allocations only; "
                "weaker than MPS)"
            ),
            "sm_pct": "does not apply without an MPS daemon",
            "priority": "does not apply without an MPS daemon",
            **_HOST_ENFORCED,
        }
    return {
        "memory_bytes": "RLIMIT_AS (address space beyond the task host's start-up footprint)",
        "sm_pct": "does not apply on cpu",
        "priority": "does not apply on cpu",
        **_HOST_ENFORCED,
    }


def support_summary(*, device: str, mps_active: bool) -> str:
    """One line on which limits hold here, e.g. for a task's state events."""
    if device.startswith("cuda"):
        if mps_active:
            return f"{device}: memory cap, SM share and priority via MPS"
        return (
            f"{device}: memory cap via set_per_process_memory_fraction (PyTorch allocations only); "
            "SM share and priority need an MPS daemon"
        )
    return f"{device}: memory cap via RLIMIT_AS; SM share and priority do not apply"


def apply_in_process(limits: GpuLimits, *, device: str, mps_active: bool) -> None:
    """Apply the limits a task process sets on itself, before its first allocation.

    CUDA without MPS: ``torch.cuda.set_per_process_memory_fraction``. CPU: ``RLIMIT_AS`` at the
    current address-space size plus ``memory_bytes`` (libraries imported later count too).
    Under MPS the environment already did it; SM share and priority have no in-process form.
    """
    if limits.memory_bytes is None or mps_active:
        return
    if device.startswith("cuda"):
        import torch

        index = torch.device(device).index or 0
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limits.memory_bytes / total), index)
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space_bytes() + limits.memory_bytes
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def _address_space_bytes() -> int:
    """This process's virtual size now (bytes)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import psutil

        return int(psutil.Process().memory_info().vms)
