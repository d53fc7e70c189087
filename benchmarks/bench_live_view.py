"""The live view under load: events the Session ingests, dashboard redraws, kernel cell latency.

    python benchmarks/bench_live_view.py       # ~2 min; writes results/live-view-cpu-<date>.json
    python benchmarks/bench_live_view.py --events-per-s 12000 --duration-s 20 --no-real-run

Two phases, each in a fresh Jupyter kernel (jupyter_client, this interpreter) that launches a
real ``Session`` and displays it, so the dashboard and its pump run exactly as in a notebook:

- ``replay``: the ranks (torchrun, one process per stage) are this file in ``--replay-rank``
  mode. Each replays a planner-made 1F1B timeline (``core.plan.simulate``) in real time at
  ``--events-per-s / stages`` events a second: ``RankStarted``, then per step its ``ActionTimed``
  events, ``StepTimed`` and ``MemoryReport``, then ``RankFinished``, through the same
  ``EventSink`` (event file + authenticated bus) a training rank uses. A synthetic run with
  many small actions, faster than real CPU training produces them.
- ``real``: a real synthetic training run (sleep-timed stages, tiny costs, many micro-batches),
  for the rate training itself reaches on this machine.

Meanwhile the driver sends trivial cells (``pass``) to the kernel one after the other and times
each round trip (``execute_request`` → ``execute_reply``); a sampler thread in the kernel records
twice a second the events that reached the session over the bus (``session.live_events``, which
merges them into the tables) and the pump's ticks and redraws (any part of the dashboard) and
the timeline's redraws.

Goals: ≥ 5,000 events/s ingested, ≤ 10 Hz redraws, < 100 ms cell latency (p95).
Ratios are printed side by side: ``ingest_ratio`` = rate / 5,000 (≥ 1 meets it),
``redraw_ratio`` = peak redraw Hz / 10 and ``latency_ratio`` = p95 / 100 ms (≤ 1 meet them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench_output import cpu_model, write_results

RESULTS = Path(__file__).parent / "results"
GOAL_EVENTS_PER_S = 5000.0
GOAL_REDRAW_HZ = 10.0
GOAL_LATENCY_MS = 100.0


# -- replay rank (runs under torchrun) -----------------------------------------------------------


def replay_rank(run_dir: str) -> int:
    """One rank of the replay run: emit the planner's timeline in real time; returns 0."""
    import signal
    import socket

    from freeride_lab.core.config import RunConfig
    from freeride_lab.core.events import (
        ActionTimed,
        MemoryReport,
        RankFinished,
        RankStarted,
        StepTimed,
    )
    from freeride_lab.core.plan import Costs, simulate
    from freeride_lab.io.rundir import RunDir
    from freeride_lab.io.sink import EventSink

    stop = {"now": False}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rd = RunDir(Path(run_dir))
    config = RunConfig.from_dict(rd.read_run()["config"])
    rate = float(config.notes["replay_events_per_s"]) / world  # this rank's events a second
    plan = simulate(config.schedule, config.stages, config.microbatches, costs=Costs(), steps=1)
    mine = plan[plan["rank"] == rank].sort_values("start_ms")
    per_step = len(mine) + 2  # actions + StepTimed + MemoryReport
    period_ms = float(plan["end_ms"].max())
    scale = (per_step / rate * 1e3) / period_ms  # planner ms -> wall ms, so the rate holds
    sink = EventSink.for_rank(rd, rank)
    t0 = time.time_ns() + 200_000_000  # every rank starts its first step 0.2 s from now
    sink.emit(
        RankStarted(
            rank=rank,
            world_size=world,
            stages=(rank,),
            pid=os.getpid(),
            host=socket.gethostname(),
            device="cpu",
            t_ns=time.time_ns(),
        )
    )
    starts = (mine["start_ms"].to_numpy() * scale * 1e6).astype("int64")
    ends = (mine["end_ms"].to_numpy() * scale * 1e6).astype("int64")
    kinds, stages_, mbs = list(mine["action"]), list(mine["stage"]), list(mine["microbatch"])
    step_ns = int(period_ms * scale * 1e6)
    done = 0
    for step in range(config.steps):
        if stop["now"]:
            break
        base = t0 + step * step_ns
        for start, end, kind, stage, mb in zip(starts, ends, kinds, stages_, mbs, strict=True):
            _sleep_until(base + int(end))
            sink.emit(
                ActionTimed(
                    rank=rank,
                    stage=int(stage),
                    step=step,
                    action=str(kind),
                    microbatch=int(mb),
                    start_ns=base + int(start),
                    end_ns=base + int(end),
                )
            )
        end_ns = base + step_ns
        _sleep_until(end_ns)
        sink.emit(
            StepTimed(
                rank=rank,
                step=step,
                start_ns=base,
                end_ns=end_ns,
                optimizer_start_ns=end_ns,
                optimizer_end_ns=end_ns,
                loss=1.0 if rank == world - 1 else None,
                tokens=0,
            )
        )
        sink.emit(
            MemoryReport(
                rank=rank,
                step=step,
                peak_reserved_bytes=1 << 28,
                capacity_bytes=1 << 34,
                device="cpu",
            )
        )
        done = step + 1
    sink.emit(RankFinished(rank=rank, steps=done, t_ns=time.time_ns(), dropped_events=sink.dropped))
    sink.close()
    return 0


def _sleep_until(t_ns: int) -> None:
    ahead = t_ns - time.time_ns()
    if ahead > 1_000_000:  # emit late events at once; sleep only when a millisecond ahead
        time.sleep(ahead / 1e9)


# -- the kernel side -----------------------------------------------------------------------------

KERNEL_SETUP = """
import json as _json, sys as _sys, threading as _threading, time as _time
from IPython.display import display as _display
from freeride_lab import RunConfig, Session
from freeride_lab.ui.dashboard import dashboard_for as _dashboard_for

session = Session.launch(RunConfig.from_dict(_json.loads({config!r})), rank_entry={entry!r})
_display(session)  # the dashboard and its pump, as in a notebook
_bench = {{"samples": [], "stop": _threading.Event()}}

def _bench_sample():
    dash = _dashboard_for(session)
    while not _bench["stop"].is_set():
        _bench["samples"].append(
            [_time.monotonic(), session.live_events, dash.ticks, dash.redraws, dash.tick_s,
             dash.timeline.redraws]
        )
        _bench["stop"].wait(0.5)

_threading.Thread(target=_bench_sample, daemon=True).start()
print(_json.dumps({{"run_dir": str(session.run_dir.path)}}))
"""

KERNEL_FINISH = """
session.wait(timeout_s=120)
_time.sleep(1.0)  # one more sample after the end
_bench["stop"].set()
_dash = _dashboard_for(session)
print(_json.dumps({
    "samples": _bench["samples"],
    "state": str(session.state),
    "events": len(session.events),
    "live_events": session.live_events,
    "steps_done": session.steps_done,
    "dashboard": {"ticks": _dash.ticks, "redraws": _dash.redraws, "errors": _dash.errors,
                  "timeline_redraws": _dash.timeline.redraws, "interval_s": _dash.interval_s,
                  "busy_frac": _dash.busy_frac},
}))
_dash.stop()
session.stop()
"""


def _run_cell(kc: Any, code: str, timeout_s: float = 300.0) -> str:
    """Execute ``code``; return its stdout (raises on an error)."""
    out: list[str] = []
    errors: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        kind, content = msg["header"]["msg_type"], msg["content"]
        if kind == "stream" and content.get("name") == "stdout":
            out.append(content["text"])
        elif kind == "error":
            errors.append(f"{content['ename']}: {content['evalue']}")

    reply = kc.execute_interactive(code, timeout=timeout_s, output_hook=hook)
    if reply["content"]["status"] != "ok" or errors:
        raise RuntimeError(f"kernel cell failed: {errors or reply['content']}")
    return "".join(out)


def _ping(kc: Any, timeout_s: float = 30.0) -> float:
    """Round trip of one trivial cell, in ms (execute_request → execute_reply)."""
    t0 = time.perf_counter()
    msg_id = kc.execute("pass", silent=False, store_history=False)
    while True:
        reply = kc.get_shell_msg(timeout=timeout_s)
        if reply["parent_header"].get("msg_id") == msg_id:
            return (time.perf_counter() - t0) * 1e3


def _drain(kc: Any) -> None:
    while True:
        try:
            kc.get_iopub_msg(timeout=0)
        except queue.Empty:
            return


def _run_done(run_dir: Path) -> bool:
    try:
        state = json.loads((run_dir / "status.json").read_text()).get("state")
    except (OSError, ValueError):
        return False
    return state in ("finished", "failed", "stopped")


def phase(name: str, config: dict[str, Any], entry: list[str], gap_s: float) -> dict[str, Any]:
    """Launch ``config`` in a fresh kernel, ping it while the run streams; return the numbers."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        idle = [_ping(kc) for _ in range(20)]
        setup = _run_cell(kc, KERNEL_SETUP.format(config=json.dumps(config), entry=entry))
        run_dir = Path(json.loads(setup.strip().splitlines()[-1])["run_dir"])
        latencies: list[tuple[float, float]] = []  # (monotonic at send, ms)
        deadline = time.monotonic() + 600
        while not _run_done(run_dir) and time.monotonic() < deadline:
            sent = time.monotonic()
            latencies.append((sent, _ping(kc)))
            _drain(kc)
            time.sleep(gap_s)
        result = json.loads(_run_cell(kc, KERNEL_FINISH).strip().splitlines()[-1])
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    return summarise(name, config, result, idle, latencies)


def summarise(
    name: str,
    config: dict[str, Any],
    result: dict[str, Any],
    idle: list[float],
    latencies: list[tuple[float, float]],
) -> dict[str, Any]:
    samples = result["samples"]  # [monotonic, live_events, ticks, redraws, tick_s, timeline]
    streaming = [s for s in samples if s[1] > 0]
    final = streaming[-1][1] if streaming else 0
    # the streaming window: first events in, until the count reached its final value
    end = next((s for s in streaming if s[1] >= final), None)
    start = streaming[0] if streaming else None
    window_s = (end[0] - start[0]) if start and end else 0.0
    rate = (end[1] - start[1]) / window_s if window_s > 0 else float("nan")
    peak_rate = _peak(samples, 1)
    redraw_hz = (end[3] - start[3]) / window_s if window_s > 0 else float("nan")
    peak_redraw_hz = _peak(samples, 3)
    timeline_hz = (end[5] - start[5]) / window_s if window_s > 0 else float("nan")
    during = [ms for t, ms in latencies if start and end and start[0] <= t <= end[0]] or [
        ms for _, ms in latencies
    ]
    p95 = _quantile(during, 0.95)
    return {
        "phase": name,
        "config": {k: config[k] for k in ("schedule", "stages", "microbatches", "steps", "notes")},
        "run_state": result["state"],
        "events_total": result["events"],
        "events_over_bus": result["live_events"],
        "steps_done": result["steps_done"],
        "streaming_s": window_s,
        "ingest_events_per_s": rate,
        "ingest_events_per_s_peak_1s": peak_rate,
        "redraw_hz": redraw_hz,
        "redraw_hz_peak_1s": peak_redraw_hz,
        "timeline_redraw_hz": timeline_hz,
        "pump": result["dashboard"],
        "mean_tick_ms": 1e3 * statistics.fmean([s[4] for s in streaming]) if streaming else None,
        "cell_latency_ms": {
            "idle_p50": _quantile(idle, 0.5),
            "p50": _quantile(during, 0.5),
            "p95": p95,
            "max": max(during) if during else None,
            "cells": len(during),
        },
        "ingest_ratio": rate / GOAL_EVENTS_PER_S,
        "redraw_ratio": peak_redraw_hz / GOAL_REDRAW_HZ,
        "latency_ratio": p95 / GOAL_LATENCY_MS if p95 is not None else None,
    }


def _peak(samples: list[list[float]], column: int) -> float:
    """Largest increase of ``column`` per second over any ~1 s span of samples."""
    best = 0.0
    for i, a in enumerate(samples):
        for b in samples[i + 1 :]:
            if b[0] - a[0] >= 0.95:
                best = max(best, (b[column] - a[column]) / (b[0] - a[0]))
                break
    return best


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def machine() -> dict[str, Any]:
    import pandas as pd
    import plotly

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "pandas": pd.__version__,
        "plotly": plotly.__version__,
        "note": "shared machine; other processes may run, so rates are lower bounds",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replay-rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--events-per-s", type=float, default=8000.0, help="replay rate, all ranks")
    parser.add_argument("--duration-s", type=float, default=30.0, help="replay length")
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--gap-ms", type=float, default=50.0, help="pause between two pings")
    parser.add_argument("--no-real-run", action="store_true", help="skip the real training phase")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.replay_rank:
        return replay_rank(args.run_dir)

    root = Path(tempfile.mkdtemp(prefix="frl-bench-live-"))
    per_step = 2 * args.microbatches + 2  # per rank: F and B per micro-batch, step, memory
    steps = max(2, int(args.duration_s * args.events_per_s / (args.stages * per_step)))
    replay = {
        "schedule": "1F1B",
        "stages": args.stages,
        "microbatches": args.microbatches,
        "steps": steps,
        "workload": "synthetic",
        "run_dir": str(root / "replay"),
        "notes": {"replay_events_per_s": args.events_per_s},
    }
    phases = [
        phase("replay", replay, [str(Path(__file__).resolve()), "--replay-rank"], args.gap_ms / 1e3)
    ]
    if not args.no_real_run:
        real = {
            "schedule": "1F1B",
            "stages": 2,
            "microbatches": 64,
            "steps": 60,
            "workload": "synthetic",
            "t_forward_ms": 0.05,
            "t_backward_input_ms": 0.05,
            "t_backward_weight_ms": 0.05,
            "run_dir": str(root / "real"),
            "notes": {},
        }
        phases.append(phase("real", real, ["-m", "freeride_lab.pipeline.rank"], args.gap_ms / 1e3))

    report = {
        "benchmark": "live-view",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "goals": {
            "ingest_events_per_s": f">= {GOAL_EVENTS_PER_S:g}",
            "redraw_hz": f"<= {GOAL_REDRAW_HZ:g}",
            "cell_latency_p95_ms": f"< {GOAL_LATENCY_MS:g}",
        },
        "phases": phases,
    }
    for p in phases:
        lat = p["cell_latency_ms"]
        print(
            f"{p['phase']:7s} ingest {p['ingest_events_per_s']:8.0f} ev/s "
            f"(peak {p['ingest_events_per_s_peak_1s']:.0f}) = {p['ingest_ratio']:.2f}x goal | "
            f"redraws {p['redraw_hz']:.1f} Hz (peak {p['redraw_hz_peak_1s']:.1f}, timeline "
            f"{p['timeline_redraw_hz']:.2f}) = "
            f"{p['redraw_ratio']:.2f} of cap | cell p50 {lat['p50']:.1f} ms "
            f"p95 {lat['p95']:.1f} ms (idle {lat['idle_p50']:.1f}) = "
            f"{p['latency_ratio']:.2f} of limit"
        )
    date = datetime.now(UTC).date().isoformat()
    write_results(report, args.out or RESULTS / f"live-view-cpu-{date}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
