"""Clock alignment across ranks: each rank's offset from its ``time.time_ns`` to rank 0's.

All event times are on the *run clock*: rank 0's ``time.time_ns``. A rank converts its own
readings by adding ``offset_ns``. Ranks on one host share the kernel's wall clock, so their
offset is exactly 0; ranks on other hosts estimate it at a barrier:

[Note: min-RTT clock offset]
In each of a few rounds every rank leaves a barrier, reads ``t1 = time.time_ns()``, all-gathers
``t1`` and reads ``t2`` when the gather returns. Rank 0's gathered ``T0`` was read at about the
same instant as this rank's ``t1`` (both just left the barrier), so ``T0 - t1`` estimates the
offset. Its error is bounded by how far apart the ranks left the barrier, which is at most the
round's ``t2 - t1`` (the round trip); the round with the smallest round trip wins.
"""

from __future__ import annotations

import hashlib
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = ["ClockSync", "host_id", "sync_clock"]


@dataclass(frozen=True, slots=True)
class ClockSync:
    """This rank's offset to the run clock (rank 0), the best round trip, and how it was got."""

    offset_ns: int  # add to time.time_ns() to get run time
    rtt_ns: int  # round trip of the round used; 0 when on rank 0's host
    same_host: bool  # True: offset is exactly 0 by construction


def host_id() -> int:
    """A 63-bit id of this host's clock: hostname and boot id (containers of one boot share it)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    digest = hashlib.sha256(f"{socket.gethostname()}/{boot}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def sync_clock(
    *, rounds: int = 5, device: torch.device | None = None, group: dist.ProcessGroup | None = None
) -> ClockSync:
    """Estimate this rank's offset to rank 0 (collective: every rank of ``group`` must call it).

    Args:
        rounds: barrier + all-gather rounds for ranks on other hosts; the min-RTT one is used.
        device: where the exchanged tensors live (``cuda:<local rank>`` under NCCL).
    """
    if rounds < 1:
        raise ValueError(f"rounds={rounds} must be >= 1")
    device = device or torch.device("cpu")
    world = dist.get_world_size(group)
    ids = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(ids, torch.tensor([host_id()], dtype=torch.int64, device=device), group=group)
    same_host = int(ids[0].item()) == host_id()
    # Every rank runs the rounds (collectives must match), even those that will not use them.
    best_rtt: int | None = None
    best_offset = 0
    for _ in range(rounds):
        dist.barrier(group=group)
        t1 = time.time_ns()
        out = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
        dist.all_gather(out, torch.tensor([t1], dtype=torch.int64, device=device), group=group)
        t2 = time.time_ns()
        rtt = t2 - t1
        if best_rtt is None or rtt < best_rtt:
            best_rtt = rtt
            best_offset = int(out[0].item()) - t1
    if same_host:
        return ClockSync(offset_ns=0, rtt_ns=0, same_host=True)
    return ClockSync(offset_ns=best_offset, rtt_ns=best_rtt or 0, same_host=False)
