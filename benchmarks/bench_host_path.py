"""The task host's own path: a bubble's start edge → its first ``step()`` call, and from one
step to the next.

Edge → step, the signal latency, has two hops: the edge reaching the task's host (a wake-up or
a spin, ``bench_edge_latency.py``) and the host's own path from seeing the edge to calling
``step()``: reading the edge, deciding the bubble is worth a step, the state machine's START,
the step's size and group, the watchdog's mark. This benchmark times that second hop alone, in
one process: a real ``TaskHost`` (its edge reader, event sink and beacon), as a managed task's
after its profile, drives a task with step sizes 1, 2 and 4 whose steps cost nothing. Each
bubble's start edge is published just before the host looks, so no wake-up is paid; the task's
step publishes the bubble's end (stamped a millisecond later, so the step does not overrun), so
every bubble gets one step.

Per bubble: the edge's stamp → ``step()`` called (what the host adds to the signal latency),
the edge's stamp → the step's recorded start (what the bench's signal latency ends at), and the
edge's publication done → ``step()`` called (the host's path alone, without the write that
publishes the edge, which in a run is the training rank's).
The bubbles make ``--blocks`` consecutive blocks (≥ 5): the mean over blocks of each figure's
p50, p90 and p99 with its 95% t-interval (``core.intervals.mean_interval``), and the share of
bubbles whose edge → step took over a millisecond (a thread of the host that takes the GIL
while the host makes a system call can keep it for the interpreter's 5 ms switch interval).

Between steps (``between_steps_us``): the same host drives a task of one step size through
long bubbles, ``--steps-per-bubble`` steps each, without step groups; per step, its ``step()``
returning → the next ``step()`` called: the step's record, the overrun check, the next
decision and the watchdog's mark, what a bubble loses between two steps besides the device
wait (on a GPU the device wait adds its own wake-up).

[Note: a cold path]
Back to back, the host's path runs hot: its code and data stay in the CPU's caches from one
bubble to the next. In a run a host sleeps between bubbles and spins only across the moment
the next one should start (``core.edge_timing``), and the machine's other processes run in
between. ``--idle-ms`` and ``--spin-ms`` put that before every bubble: the host sleeps, then
spins in its edge reader's wait (nothing comes, the spin runs out), and only then is the edge
published.

    python benchmarks/bench_host_path.py --bubbles 4000 --blocks 8 --out host-path.json
    python benchmarks/bench_host_path.py --bubbles 400 --steps-per-bubble 20 --out host-path.json
    python benchmarks/bench_host_path.py --bubbles 1000 --idle-ms 28 --spin-ms 2 --out cold.json

Run it with ``PYTHONPATH`` naming another tree of the package to time that tree's host.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from bench_output import command_line, cpu_model, write_results

from freeride_lab.core.budget import Profile
from freeride_lab.core.intervals import mean_interval
from freeride_lab.core.sidetask_state import SideTaskEvent
from freeride_lab.io.sink import EventSink
from freeride_lab.sidetasks.api import IterativeSideTask
from freeride_lab.sidetasks.edges import EdgeWriter, edge_path
from freeride_lab.sidetasks.heartbeat import TaskBeacon
from freeride_lab.sidetasks.host.task_host import TaskHost
from freeride_lab.sidetasks.spec import HostSpec, TaskSpec

STEP_S = 0.004  # the profile's median step: FreeRide's guard, 10 ms x 1.2, as managed
PREDICTED_NS = 200_000_000  # each bubble is predicted long enough for any step
END_AFTER_NS = 1_000_000  # a bubble's end edge is stamped this long after it is published
SLOW_US = 1000.0  # a bubble whose edge → step took longer is counted apart (``over_1ms_frac``)


class Instant(IterativeSideTask):
    """A task with step sizes 1, 2 and 4 whose step costs nothing but ending its bubble."""

    unit = "steps"

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []
        self.end_bubble = lambda: None

    @property
    def step_sizes(self) -> tuple[int, ...]:
        return (1, 2, 4)

    def step(self, size: int = 1) -> float:
        self.calls.append(time.time_ns())
        self.end_bubble()
        return float(size)


class Consecutive(IterativeSideTask):
    """A task of one step size whose step costs nothing but noting when it was called and
    when it returned, and ending its bubble after ``per_bubble`` steps."""

    unit = "steps"

    def __init__(self) -> None:
        super().__init__()
        self.called: list[int] = []
        self.returned: list[int] = []
        self.per_bubble = 1
        self.end_bubble = lambda: None

    def step(self, size: int = 1) -> float:
        self.called.append(time.perf_counter_ns())
        if len(self.called) % self.per_bubble == 0:
            self.end_bubble()
        self.returned.append(time.perf_counter_ns())
        return 1.0


@contextlib.contextmanager
def _host(workdir: Path, task_path: str, **options: Any) -> Iterator[tuple[TaskHost, EdgeWriter]]:
    """A real ``TaskHost`` in this process, its task not yet set, and the writer of its edge
    file; its event sink (``workdir / "task.jsonl"``), edge reader, writer and beacon are
    closed on the way out."""
    writer = EdgeWriter.create(edge_path(workdir, 0))
    spec = TaskSpec.from_dict({"task": task_path, "task_id": "t1"})
    beacon = TaskBeacon.create()
    sink = EventSink(workdir / "task.jsonl")
    host = TaskHost(HostSpec(task=spec, run_dir=str(workdir), rank=0, stage=0), conn=None,
                    sink=sink, beacon=TaskBeacon.attach(beacon.fd), **options)  # fmt: skip
    try:
        yield host, writer
    finally:
        sink.close()
        if host._reader is not None:
            host.reader.close()
        writer.close()
        beacon.close()


def _managed(host: TaskHost, task: IterativeSideTask, sizes: tuple[int, ...]) -> None:
    """``task`` on ``host`` as a managed task's after its profile: the guard from the
    profile, every size timed."""
    host.task = task
    for event in (SideTaskEvent.CREATE, SideTaskEvent.INIT):
        host._apply(event)
    if not host._open_reader():
        raise RuntimeError("the host could not open its edge file")
    host.profile = Profile(median_step_s=STEP_S, p95_step_s=STEP_S, peak_memory_bytes=0,
                           n_steps=5)  # fmt: skip
    for size in sizes:
        for _ in range(3):
            host._note_size_time(size, 1, round(STEP_S * 1e9 * size / sizes[-1]))


def _one_bubble(
    host: TaskHost, writer: EdgeWriter, task: Any, i: int, idle_s: float = 0.0, spin_s: float = 0.0
) -> tuple[int, int]:
    """Publish bubble ``i``'s start just before the host looks, and let the host run it; the
    task's step publishes its end, stamped after the step, so no step overruns (no overrun
    policy at work after it). Before it, the host sleeps ``idle_s`` and then spins ``spin_s``
    in its edge reader's wait, as a host waits for a bubble in a run ([Note: a cold path]).
    Returns the start's stamp and when its publication was done (ns)."""
    task.end_bubble = lambda: writer.bubble_end(i, 0, time.time_ns() + END_AFTER_NS)
    if idle_s > 0:
        time.sleep(idle_s)
    if spin_s > 0:
        host.reader.wait(timeout_s=0.0, spin_s=spin_s)  # nothing comes: the spin runs out
    t_ns = time.time_ns()
    writer.bubble_start(i, 0, t_ns, t_ns + PREDICTED_NS)
    visible_ns = time.time_ns()
    edge = host._wait_for_edge(0.1)
    if edge is None or not edge.in_bubble:
        raise RuntimeError(f"bubble {i}: the host saw {edge!r}")
    host._run_bubble(edge)
    return t_ns, visible_ns


def measure_between(bubbles: int, per_bubble: int, blocks: int, workdir: Path) -> dict[str, Any]:
    """Drive ``bubbles`` bubbles of ``per_bubble`` steps each through one in-process host
    (no step groups); per-block statistics of the time from a step's return to the next
    step's call, in µs."""
    if blocks < 5:
        raise SystemExit(f"--blocks {blocks}: an interval needs at least 5 blocks")
    if per_bubble < 2:
        raise SystemExit(f"--steps-per-bubble {per_bubble}: a gap needs two steps a bubble")
    task = Consecutive()
    task.per_bubble = per_bubble
    gaps_us = []
    warm_up = max(5, bubbles // 20)
    with _host(workdir, "bench_host_path:Consecutive", step_group_ns=0) as (host, writer):
        _managed(host, task, (1,))
        for i in range(warm_up + bubbles):
            n = len(task.called)
            _one_bubble(host, writer, task, i)
            if len(task.called) != n + per_bubble:
                raise RuntimeError(f"bubble {i}: {len(task.called) - n} steps, not {per_bubble}")
            if i >= warm_up:
                gaps_us += [(task.called[k + 1] - task.returned[k]) / 1e3
                            for k in range(n, n + per_bubble - 1)]  # fmt: skip
    return {"steps_per_bubble": per_bubble, "between_steps_us": _blocks(gaps_us, blocks)}


def measure(
    bubbles: int, blocks: int, workdir: Path, idle_s: float = 0.0, spin_s: float = 0.0
) -> dict[str, Any]:
    """Drive ``bubbles`` bubbles through one in-process host, each after ``idle_s`` asleep and
    ``spin_s`` spinning (``_one_bubble``); per-block statistics in µs."""
    if blocks < 5:
        raise SystemExit(f"--blocks {blocks}: an interval needs at least 5 blocks")
    task = Instant()
    call_us, start_us, visible_us = [], [], []
    warm_up = max(20, bubbles // 20)
    with _host(workdir, "bench_host_path:Instant") as (host, writer):
        _managed(host, task, (1, 2, 4))
        for i in range(warm_up + bubbles):
            n = len(task.calls)
            t_ns, visible_ns = _one_bubble(host, writer, task, i, idle_s, spin_s)
            if len(task.calls) != n + 1:
                raise RuntimeError(f"bubble {i}: {len(task.calls) - n} steps, expected 1")
            if i >= warm_up:
                call_us.append((task.calls[n] - t_ns) / 1e3)
                visible_us.append((task.calls[n] - visible_ns) / 1e3)
                start_us.append(t_ns)
    starts = _step_starts(workdir / "task.jsonl")[-bubbles:]  # the sink is closed: all written
    start_us = [(s - t) / 1e3 for s, t in zip(starts, start_us, strict=True)]
    return {
        "bubbles": bubbles,
        "warm_up_bubbles": warm_up,
        "idle_ms": round(idle_s * 1e3, 3),
        "spin_ms": round(spin_s * 1e3, 3),
        "edge_to_call_us": _blocks(call_us, blocks),
        "edge_to_recorded_start_us": _blocks(start_us, blocks),
        "visible_to_call_us": _blocks(visible_us, blocks),
    }


def _step_starts(path: Path) -> list[int]:
    """The recorded start of every step in a task's event file, in order."""
    import json

    return [
        int(event["start_ns"])
        for event in (json.loads(line) for line in path.read_text().splitlines() if line)
        if event.get("kind") == "side_task_step"
    ]


def _blocks(values_us: list[float], blocks: int) -> dict[str, Any]:
    parts = [np.asarray(b) for b in np.array_split(np.asarray(values_us), blocks)]
    out: dict[str, Any] = {"blocks": len(parts), "per_block": len(parts[0])}
    for q in (50, 90, 99):
        iv = mean_interval([float(np.percentile(b, q)) for b in parts])
        out[f"p{q}"] = {"value": round(iv.value, 2), "lo": round(iv.lo, 2), "hi": round(iv.hi, 2)}
    # the tail a thread that takes the GIL gives: the interpreter's switch interval is 5 ms
    iv = mean_interval([float(np.mean(b > SLOW_US)) for b in parts])
    out["over_1ms_frac"] = {"value": round(iv.value, 5), "lo": round(iv.lo, 5),
                            "hi": round(iv.hi, 5)}  # fmt: skip
    return out


def _pct_interval(iv: dict[str, float]) -> str:
    return f"{100 * iv['value']:.2f}% [{100 * iv['lo']:.2f}, {100 * iv['hi']:.2f}]"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bubbles", type=int, default=4000, help="bubbles measured")
    ap.add_argument("--blocks", type=int, default=8, help="blocks (>= 5) for the intervals")
    ap.add_argument("--steps-per-bubble", type=int, default=20,
                    help="steps in each bubble of the between-steps phase (>= 2)")  # fmt: skip
    ap.add_argument("--idle-ms", type=float, default=0.0,
                    help="the host sleeps this long before each bubble (a cold path)")  # fmt: skip
    ap.add_argument("--spin-ms", type=float, default=0.0,
                    help="then spins this long in its edge reader's wait")  # fmt: skip
    ap.add_argument("--out", type=Path, required=True, help="results JSON")
    ap.add_argument("--note", default="", help="what to say about the machine or the tree")
    args = ap.parse_args(argv)
    if not all(0 <= t < math.inf for t in (args.idle_ms, args.spin_ms)):  # nan fails too
        ap.error("--idle-ms and --spin-ms are times: give a finite 0 or more")
    sys.modules.setdefault("bench_host_path", sys.modules[__name__])  # the spec's reference
    with tempfile.TemporaryDirectory(prefix="host-path-") as tmp:
        figures = measure(args.bubbles, args.blocks, Path(tmp), args.idle_ms / 1e3,
                          args.spin_ms / 1e3)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="host-path-") as tmp:
        figures |= measure_between(args.bubbles, args.steps_per_bubble, args.blocks, Path(tmp))
    result = {
        "benchmark": "host_path",
        "command": command_line(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "cpu_model": cpu_model(),
            "cpu_count": os.cpu_count(),
            "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
            "python": platform.python_version(),
        },
        "note": args.note,
        **figures,
    }
    for name in ("edge_to_call_us", "edge_to_recorded_start_us", "visible_to_call_us",
                 "between_steps_us"):  # fmt: skip
        b = result[name]
        print(f"{name}: {b['blocks']} blocks of {b['per_block']}: p50 {b['p50']['value']:.1f} "
              f"[{b['p50']['lo']:.1f}, {b['p50']['hi']:.1f}] us, p90 {b['p90']['value']:.1f} "
              f"[{b['p90']['lo']:.1f}, {b['p90']['hi']:.1f}] us, p99 {b['p99']['value']:.1f} "
              f"[{b['p99']['lo']:.1f}, {b['p99']['hi']:.1f}] us, over 1 ms "
              + _pct_interval(b["over_1ms_frac"]))  # fmt: skip
    write_results(result, args.out)


if __name__ == "__main__":
    main()
