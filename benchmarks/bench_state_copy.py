"""What taking a vision task's state for a checkpoint holds its host: pageable against pinned.

A periodic checkpoint is written by a thread, but the state is taken on the task host's own
thread (``state_dict()``: host copies of the weights and the Adam state), and while it copies,
the host reads no edge: its bubbles, and its leftovers task's, go unused. For each task (GPU
preset, stepped a few batches so Adam's state exists) the two ways alternate, ``--repeats``
times each: "pageable" copies tensor by tensor into fresh pageable memory and waits for each
(``tensor.to("cpu", copy=True)``, the way before 2026-12-07), "pinned" is
``sidetasks.api.host_copies`` as tasks run it (pinned blocks from torch's caching host
allocator, every copy queued before one wait), and "in flight" is that inside
``copies_in_flight()``, as a periodic checkpoint takes it since 2026-12-07 (the copies queued,
the wait left to the writer thread; ``sidetasks.host_copy`` [Note: copies left in flight]).
Reported per task and way: the state's size, the first take and the median and highest of the
others (ms), wall time of the whole ``state_dict()``-sized copy on the host's thread; for "in
flight" that is what holds the host, and ``landed`` the same figures until the copies had
landed (the writer's wait returned).

With ``--pin-ahead`` the blocks are first pinned from a thread (``pin_ahead``: blocks of the
state's tensors' sizes from torch's caching host allocator, held until the last is pinned, then
given back to its cache), while this thread runs a loop and times its own longest turn: Python
alone (``python``), or a small kernel and a wait on it, as a task host stepping does
(``cuda``); the pinned way's first take then shows what a first checkpoint would take after
it. Run it in a process of its own: pinned blocks stay in the process's cache.

    python benchmarks/bench_state_copy.py --out state-copy.json
    python benchmarks/bench_state_copy.py --pin-ahead cuda --out state-copy-ahead.json
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Any

import torch
from bench_output import command_line, write_results

from freeride_lab.sidetasks.host_copy import copies_in_flight, host_copies
from freeride_lab.tasks.vision import ResNet18Task, VGG19Task

TASKS = {"resnet18": ResNet18Task, "vgg19": VGG19Task}


def pageable_copies(state: Any) -> Any:
    """The way before: each tensor to fresh pageable host memory, one wait each."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {k: pageable_copies(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(pageable_copies(v) for v in state)
    return state


def live_state(task: Any) -> dict[str, Any]:
    """The device tensors a vision task's ``state_dict()`` copies: weights and Adam state."""
    model, optimizer, _, _ = task._require_setup()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def _nbytes(state: Any) -> int:
    return sum(t.nbytes for t in _tensors(state))


def state_sizes(task: Any) -> list[int]:
    """The bytes of each tensor a vision task's ``state_dict()`` copies from its device:
    weights, buffers and Adam's state, and the gradients a checkpoint between slices keeps."""
    model, _, _, _ = task._require_setup()
    tensors = _tensors(live_state(task)) + [
        p.grad for p in model.parameters() if p.grad is not None
    ]
    return [t.nbytes for t in tensors if t.is_cuda and t.nbytes]


def _tensors(state: Any) -> list[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        state = list(state.values())
    return [t for v in state for t in _tensors(v)] if isinstance(state, list | tuple) else []


def pin_ahead(sizes: list[int]) -> int:
    """Pin host blocks of these sizes in torch's caching host allocator, all held until the
    last is pinned (so each size gets a block of its own), then given back to its cache; the
    bytes pinned."""
    blocks = [torch.empty(size, dtype=torch.uint8, pin_memory=True) for size in sizes]
    return sum(block.nbytes for block in blocks)


def pin_ahead_beside(task: Any, beside: str) -> dict[str, Any]:
    """Pin ``task``'s state's blocks from a thread while this one runs a loop: Python alone
    (``beside="python"``), or a small kernel and a wait on it, as a task host stepping does
    (``"cuda"``); the bytes, the pinning's wall time, this thread's turns and its longest."""
    sizes = state_sizes(task)
    a = torch.randn(256, 256, device="cuda")
    pinned: list[int] = []
    pinner = threading.Thread(target=lambda: pinned.append(pin_ahead(sizes)))
    t0 = last = time.perf_counter_ns()
    longest = turns = 0
    pinner.start()
    while pinner.is_alive():
        if beside == "cuda":
            torch.mm(a, a)
            torch.cuda.synchronize()
        now = time.perf_counter_ns()
        longest, last, turns = max(longest, now - last), now, turns + 1
    pinner.join()
    return {
        "beside": beside,
        "bytes": pinned[0],
        "tensors": len(sizes),
        "ms": (time.perf_counter_ns() - t0) / 1e6,
        "turns": turns,
        "main_thread_longest_gap_ms": longest / 1e6,
    }


def measure(name: str, repeats: int, *, ahead: str = "") -> dict[str, Any]:
    task = TASKS[name](preset="gpu")
    task.setup()
    task.to_device("cuda")
    for _ in range(3):  # Adam's moments exist after the first step
        task.step()
    torch.cuda.synchronize()
    state = live_state(task)
    row: dict[str, Any] = {"task": name, "state_bytes": _nbytes(state)}
    if ahead:
        row["pin_ahead"] = pin_ahead_beside(task, ahead)
    times: dict[str, list[float]] = {"pageable": [], "pinned": [], "in_flight": [], "landed": []}
    for _ in range(repeats):
        for way, copy in (("pageable", pageable_copies), ("pinned", host_copies)):
            t0 = time.perf_counter()
            held = copy(state)
            times[way].append((time.perf_counter() - t0) * 1e3)
            del held  # freed, as a written checkpoint's copies are
        t0 = time.perf_counter()
        with copies_in_flight() as copies:
            held = host_copies(state)
        times["in_flight"].append((time.perf_counter() - t0) * 1e3)
        copies.wait()  # the writer's wait
        times["landed"].append((time.perf_counter() - t0) * 1e3)
        del held
    for way, ms in times.items():
        rest = sorted(ms[1:])
        row[way] = {"first_ms": ms[0], "median_ms": rest[len(rest) // 2], "max_ms": rest[-1]}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="resnet18,vgg19")
    parser.add_argument("--repeats", type=int, default=6, help="takes per way (>= 3)")
    parser.add_argument(
        "--pin-ahead",
        choices=("python", "cuda"),
        default="",
        help="pin each task's blocks first, from a thread, beside Python or CUDA work",
    )
    parser.add_argument("--out", type=Path, required=True, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    if args.repeats < 3:
        parser.error("--repeats must be >= 3")
    rows = []
    for name in (n for n in args.tasks.split(",") if n):
        if name not in TASKS:
            parser.error(f"unknown task {name!r}; one of {', '.join(TASKS)}")
        rows.append(measure(name, args.repeats, ahead=args.pin_ahead))
        print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    record = {
        "command": command_line(),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "rows": rows,
    }
    write_results(record, args.out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
