"""Clock alignment across ranks: each rank's offset from its ``time.time_ns`` to rank 0's.

All event times are on the *run clock*: rank 0's ``time.time_ns``. A rank converts its own
readings by adding ``offset_ns``. Ranks on rank 0's host share the kernel's wall clock, so their
offset is exactly 0; ranks on other hosts estimate it by exchanging time stamps with rank 0:

[Note: min-RTT clock offset]
Cristian's method, as NTP uses it. In each exchange rank r reads ``t1`` on its clock, sends a
request to rank 0, rank 0 reads ``T`` on its clock once the request has arrived and sends it
back, and rank r reads ``t2`` once the reply has arrived. ``T`` was read after ``t1`` and before
``t2`` (the request left after ``t1``; the reply arrived before ``t2``), so with the true
offset θ (run time = rank r's time + θ), ``T - θ`` lies in [t1, t2] and the estimate

    θ̂ = T - (t1 + t2) / 2        is off by at most    (t2 - t1) / 2 = RTT / 2,

however unevenly the two legs are delayed. Of ``rounds`` exchanges the one with the smallest
round trip gives the tightest bound; its θ̂ is the offset and its RTT / 2 the uncertainty.
Rank 0 serves the other ranks one at a time. The exchanges carry host clock readings in CPU
tensors over gloo (a gloo group is made for them when the run's backend is NCCL), so neither
kernel launches nor device synchronisation add to the round trip.

Ranks on rank 0's host take offset 0 (exact) and report uncertainty 0; they still run the
exchanges, whose estimate must then be within RTT / 2 of 0 (logged as a check). A ``clock``
other than ``time.time_ns`` is always taken as measured: it need not be the kernel's clock.
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = ["ClockSync", "host_id", "sync_clock"]


@dataclass(frozen=True, slots=True)
class ClockSync:
    """This rank's offset to the run clock (rank 0), how sure it is, and how it was got."""

    offset_ns: int  # add to this rank's clock to get run time
    uncertainty_ns: int  # |offset_ns - true offset| <= this: the used exchange's RTT / 2; 0 exact
    rtt_ns: int  # round trip of the min-RTT exchange; 0 on rank 0
    measured_offset_ns: int  # that exchange's estimate (a check where offset_ns is exact)
    same_host: bool  # True: on rank 0's host with the kernel's clock, offset 0 by construction


def host_id() -> int:
    """A 63-bit id of this host's clock: hostname and boot id (containers of one boot share it)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    digest = hashlib.sha256(f"{socket.gethostname()}/{boot}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def sync_clock(
    *,
    rounds: int = 10,
    group: dist.ProcessGroup | None = None,
    clock: Callable[[], int] = time.time_ns,
) -> ClockSync:
    """Estimate this rank's offset to rank 0 (collective: every rank of ``group`` must call it).

    Args:
        rounds: exchanges between rank 0 and each other rank; the min-RTT one is used
            (see [Note: min-RTT clock offset]).
        group: the ranks to align (default: the whole job). Its backend must be gloo; None
            uses the default group if it is gloo, else a gloo group made for the exchanges.
        clock: this rank's clock in ns (``time.time_ns``; tests pass a shifted one).

    Raises:
        ValueError: ``rounds`` < 1.
    """
    if rounds < 1:
        raise ValueError(f"rounds={rounds} must be >= 1 (exchanges per rank); the default is 10")
    made = None
    if group is None and "gloo" not in str(dist.get_backend()):
        group = made = dist.new_group(backend="gloo")  # collective: every rank makes it
    try:
        return _sync(rounds, group, clock)
    finally:
        if made is not None:
            dist.destroy_process_group(made)


def _sync(rounds: int, group: dist.ProcessGroup | None, clock: Callable[[], int]) -> ClockSync:
    world = dist.get_world_size(group)
    me = dist.get_rank(group)
    ids = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(ids, torch.tensor([host_id()], dtype=torch.int64), group=group)
    same_host = int(ids[0].item()) == host_id() and clock is time.time_ns

    def peer(group_rank: int) -> int:
        return group_rank if group is None else dist.get_global_rank(group, group_rank)

    stamp = torch.zeros(1, dtype=torch.int64)
    if me == 0:
        for r in range(1, world):
            for _ in range(rounds):
                dist.recv(stamp, src=peer(r), group=group)
                stamp[0] = clock()
                dist.send(stamp, dst=peer(r), group=group)
        return ClockSync(
            offset_ns=0, uncertainty_ns=0, rtt_ns=0, measured_offset_ns=0, same_host=True
        )
    exchanges = []  # (rtt, estimate)
    for _ in range(rounds):
        t1 = clock()
        stamp[0] = t1
        dist.send(stamp, dst=peer(0), group=group)
        dist.recv(stamp, src=peer(0), group=group)
        t2 = clock()
        exchanges.append((t2 - t1, int(stamp.item()) - (t1 + t2) // 2))
    rtt, estimate = min(exchanges, key=lambda e: e[0])
    if same_host:
        return ClockSync(
            offset_ns=0, uncertainty_ns=0, rtt_ns=rtt, measured_offset_ns=estimate, same_host=True
        )
    return ClockSync(
        offset_ns=estimate,
        uncertainty_ns=(rtt + 1) // 2,
        rtt_ns=rtt,
        measured_offset_ns=estimate,
        same_host=False,
    )
