"""What waiting for bubble edges costs a CUDA training loop: sleeping wait against polling.

A rank's CUDA edge watcher (``pipeline.timed_stage._CudaEdgeWatcher``) turns each bubble's
start and end events into live edges. It waits on each event with ``synchronize()`` on a
blocking-sync event, which sleeps with the GIL released. The watcher before it polled
``query()`` every 50 µs, taking the GIL 20,000 times a second from the thread that launches
the training kernels. This script puts a number on the difference, in one process, on a
launch-bound loop (16 "actions" of small kernels per step, every gap announced):

- ``none``: the recorder without live edges (no watcher thread at all);
- ``sleep``: live edges, today's watcher;
- ``poll``: live edges, the polling watcher (defined here, as it was).

Blocks of ``--block`` steps rotate through the three modes (none, sleep, poll, none, ...) so
drift hits all alike; per mode the mean step time, and per watcher its paired difference to
the ``none`` blocks beside it with a 95% interval. Every step ends with a device
synchronisation, so a step's time is its kernels' time plus whatever the host added.

    python benchmarks/bench_edge_watcher.py --out /tmp/edge-watcher.json     # needs CUDA
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime
from pathlib import Path
from statistics import mean
from typing import Any

import torch
from bench_output import command_line, write_results

from freeride_lab.core.intervals import mean_interval
from freeride_lab.core.schedule import ActionKind
from freeride_lab.pipeline.timed_stage import ActionRecorder, _CudaEdgeWatcher

MODES = ("none", "sleep", "poll")


class _NullEdges:
    def bubble_start(self, step: int, slot: int, t_ns: int, predicted_end_ns: int | None) -> None:
        pass

    def bubble_end(self, step: int, slot: int, t_ns: int) -> None:
        pass


class PollingWatcher(_CudaEdgeWatcher):
    """The watcher as it was: ``query()`` every ``poll_s`` with the GIL taken each time."""

    poll_s = 50e-6

    def _run(self) -> None:
        while not self._closed:
            if not self._edge_queued():
                continue
            edge, step, slot, event, duration_ns = self._queue[0]
            if not event.query():
                time.sleep(self.poll_s)
                continue
            self._queue.popleft()
            self._announce(edge, step, slot, event, duration_ns)


def recorder(mode: str) -> ActionRecorder:
    if mode == "none":
        return ActionRecorder(device="cuda")
    rec = ActionRecorder(device="cuda", edges=_NullEdges(), announce_min_ns=0)
    if mode == "poll":
        assert rec._watcher is not None and rec._tracker is not None
        rec._watcher.close()
        rec._watcher = PollingWatcher(rec._tracker, 0, rec.clock.release)
    return rec


def run_step(rec: ActionRecorder, step: int, x: torch.Tensor, w: torch.Tensor, k: int) -> float:
    """One step of 16 actions of ``k`` small matmuls each; returns its wall time in ms."""
    t0 = time.perf_counter()
    rec.begin_step(step)
    for i in range(16):
        token = rec.start(ActionKind.FORWARD, 0, i)
        y = x
        for _ in range(k):
            y = torch.tanh(y @ w)
        rec.stop(token)
    rec.end_window()
    rec.finish_step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=30, help="blocks per mode")
    p.add_argument("--block", type=int, default=20, help="steps per block")
    p.add_argument("--size", type=int, default=256, help="matrix side of the small kernels")
    p.add_argument("--kernels", type=int, default=8, help="matmuls per action")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_edge_watcher: needs a CUDA device")
    x = torch.randn(args.size, args.size, device="cuda")
    w = torch.randn(args.size, args.size, device="cuda") / args.size**0.5
    recs = {mode: recorder(mode) for mode in MODES}
    for mode in MODES:  # warm up every path
        for s in range(5):
            run_step(recs[mode], s, x, w, args.kernels)
    blocks: dict[str, list[float]] = {mode: [] for mode in MODES}
    step = 5
    for _ in range(args.blocks):
        for mode in MODES:
            times = [run_step(recs[mode], step + i, x, w, args.kernels) for i in range(args.block)]
            step += args.block
            blocks[mode].append(mean(times[1:]))  # the first step carries the switch
    for rec in recs.values():
        rec.flush()
        rec.close()
    result: dict[str, Any] = {
        "benchmark": "edge_watcher",
        "command": command_line(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__},
        "config": vars(args) | {"out": str(args.out) if args.out else None},
        "step_ms": {mode: round(mean(v), 4) for mode, v in blocks.items()},
        "vs_none_frac": {},
    }
    for mode in ("sleep", "poll"):
        iv = mean_interval([a / b - 1 for a, b in zip(blocks[mode], blocks["none"], strict=True)])
        result["vs_none_frac"][mode] = {
            "value": round(iv.value, 5), "lo": round(iv.lo, 5), "hi": round(iv.hi, 5),
            "blocks": iv.n,
        }  # fmt: skip
        print(
            f"{mode:6s} step {result['step_ms'][mode]:.3f} ms vs none "
            f"{result['step_ms']['none']:.3f} ms: {iv.value:+.2%} [{iv.lo:+.2%}, {iv.hi:+.2%}]"
        )
    if args.out:
        write_results(result, args.out)


if __name__ == "__main__":
    main()
