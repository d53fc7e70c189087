"""``SmShare``: run a process's own GPU work on part of the SMs, switched per step, no restart.

MPS's active-thread percentage is read once, when a process initialises CUDA, so changing it
means a new process. A CUDA green context (``torch.cuda.green_contexts``, where the installed
torch has them) holds a partition of the device's SMs inside the running process: work launched
while it is current runs on those SMs only, and popping it gives the process the whole device
back. The task host uses one for the steps a trickle task runs through training's compute
(``GpuLimits.trickle_sm_pct``), so those steps leave most SMs to training while the same task's
steps in bubbles keep the full share.

On an H200 (132 SMs, torch 2.11, CUDA 13) an 8192² bf16 matmul took 1.41 ms on the whole device,
2.68 ms on 66 SMs and 4.21 ms on 40; switching costs no restart. Where green contexts are
missing (CPU, an older torch or driver), ``SmShare.create`` returns None with the reason.

    >>> share, why = SmShare.create("cpu", 25)
    >>> share is None, why
    (True, 'a share of SMs needs a CUDA device; this task runs on cpu')
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

__all__ = ["SM_GRANULE", "SmShare", "sm_count_for"]

#: Green contexts split SMs in groups; 8 is the group size on Hopper (and a multiple of it
#: elsewhere), so shares are rounded to it.
SM_GRANULE = 8


def sm_count_for(pct: float, total_sms: int) -> int:
    """SMs for a share of ``pct`` percent of ``total_sms``: rounded to ``SM_GRANULE``, at least
    one granule, at most the device.

    >>> sm_count_for(25, 132), sm_count_for(1, 132), sm_count_for(100, 132)
    (32, 8, 132)
    """
    if not 0 < pct <= 100:
        raise ValueError(f"pct={pct!r} must be in (0, 100]")
    wanted = pct / 100 * total_sms
    count = max(SM_GRANULE, SM_GRANULE * math.floor(wanted / SM_GRANULE + 0.5))
    return min(count, total_sms)


class SmShare:
    """A green context of ``num_sms`` SMs of one CUDA device; ``active()`` runs work on it."""

    def __init__(self, context: Any, num_sms: int, total_sms: int) -> None:
        self._context = context
        self.num_sms = num_sms
        self.total_sms = total_sms

    def __repr__(self) -> str:
        return f"<SmShare {self.num_sms} of {self.total_sms} SMs>"

    @classmethod
    def create(cls, device: str, pct: float) -> tuple[SmShare | None, str]:
        """A share of ``pct`` percent of ``device``'s SMs, or None and why it is not available."""
        if not device.startswith("cuda"):
            return None, f"a share of SMs needs a CUDA device; this task runs on {device}"
        import torch

        try:
            from torch.cuda import green_contexts
        except ImportError:
            return None, f"torch {torch.__version__} has no CUDA green contexts"
        if not green_contexts.SUPPORTED:
            return None, f"torch {torch.__version__} was built without CUDA green contexts"
        index = torch.device(device).index or 0
        total = int(torch.cuda.get_device_properties(index).multi_processor_count)
        count = sm_count_for(pct, total)
        try:
            context = green_contexts.GreenContext.create(num_sms=count, device_id=index)
        except RuntimeError as exc:  # an old driver, or a device that cannot split
            return None, f"no green context of {count} SMs on {device}: {exc}"
        return cls(context, count, total), f"{count} of {total} SMs (CUDA green context)"

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Work launched inside runs on this share's SMs; the previous context after."""
        self._context.set_context()
        try:
            yield
        finally:
            self._context.pop_context()
