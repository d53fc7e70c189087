"""How long a bubble edge takes from the rank's ``EdgeWriter`` to a reader in another process.

The writer (this process) publishes alternating bubble start/end edges at random 1-3 ms gaps,
each stamped with ``time.time_ns()``; a reader process records when it sees each one. Readers:

- ``wait``: ``EdgeReader.wait`` (sleeps until the writer wakes it, see sidetasks/edge_wake.py);
- ``wait+spin``: what a GPU run's side-task host does: it predicts the next edge (a bubble's
  end from the rank's prediction, the next start from ``core.edge_timing.NextBubbleClock``),
  sleeps until 300 µs before it, then spins (``wait(spin_s=)``): across a start, to the end of
  the clock's spin window (the slot's recent lateness, at most 2 ms: ``core.edge_timing``
  [Note: spin window]); across an end, to 300 µs after it;
- ``wait+spin-fixed``: the same with the window the host had before it learned the lateness:
  300 µs either side of every predicted start;
- ``poll-1ms``: a naive reader that checks ``EdgeReader.latest()`` and sleeps 1 ms;
- ``poll-10ms``: the same at 10 ms, the tick of FreeRide's reference manager (paper notes §5).

Each reader runs with three writers: one that spins between edges at random 1-3 ms gaps (a
rank that computes), one that sleeps instead (cold caches, an idle CPU to wake), and
``pipeline``: a rank computing a periodic step of four bubbles (idle 2, 1, 1.5, 3 ms, compute
1, 2.5, 1.2, 2 ms after them, ±20 µs jitter), the shape a real pipeline stage has and the only
one where edges can be foreseen; ``pipeline-jitter``: the same step with each compute gap
jittered uniformly by ±``--jitter-ms`` / 2 (0.5 ms: a step's compute varies by more than a
fixed spin around its shortest gap covers).

With ``--blocks`` B (≥ 5), each run's start edges also make B consecutive blocks: the mean over
blocks of the start latency's p50 and p90, and of the share of starts seen within 20 µs (no
wake-up paid), each with its 95% t-interval (``core.intervals.mean_interval``), and the reader
process's CPU time per second of the run (what spinning costs).

Latency of edge i = when the reader first saw edge i or a newer one, minus the edge's time, both
``time.time_ns()`` of one host (a polling reader may never see an edge that a newer one replaced
before its next look: "superseded"; it learns the newer state then). It also reports what one
``bubble_start``/``bubble_end`` call costs the writer (the training hot path): after the 1-3 ms
idle gaps of the run (cold caches, a reader to wake) and back to back (warm, nobody waiting).

    python benchmarks/bench_edge_latency.py                  # 2000 edges per reader
    python benchmarks/bench_edge_latency.py --edges 500 --out /tmp/edge.json
    python benchmarks/bench_edge_latency.py --readers wait --writers busy sleep pipeline
    python benchmarks/bench_edge_latency.py --readers wait+spin-fixed wait+spin \
        --writers pipeline-jitter --edges 4000 --blocks 8
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from bench_output import cpu_model, write_results

from freeride_lab.core.edge_timing import NextBubbleClock
from freeride_lab.core.intervals import mean_interval
from freeride_lab.sidetasks.edges import Edge, EdgeReader, EdgeWriter, Phase

MODES = ("wait", "wait+spin", "wait+spin-fixed", "poll-1ms", "poll-10ms")
WRITERS = ("busy", "sleep", "pipeline", "pipeline-jitter")
PIPELINE_IDLE_MS = (2.0, 1.0, 1.5, 3.0)  # bubble lengths of one step, by slot
PIPELINE_BUSY_MS = (1.0, 2.5, 1.2, 2.0)  # compute after each bubble
PIPELINE_JITTER_MS = 0.02
SPIN_LEAD_S = 300e-6  # as sidetasks/host/base.py
SPIN_MOST_S = 2e-3  # as sidetasks/host/task_host.py
NO_WAKE_US = 20.0  # a start seen within this was seen spinning, not woken
RESULTS = Path(__file__).parent / "results" / "edge_latency.json"


def run_reader(path: Path, mode: str, out: Path) -> None:
    """Reader process: record (seq, seen time) of every observation until CLOSED."""
    reader = EdgeReader.open(path, timeout_s=10)
    poll_s = {"poll-1ms": 0.001, "poll-10ms": 0.010}.get(mode)
    seen: list[tuple[int, int]] = []
    last = reader.latest()
    last_seq = 0 if last is None else last.seq
    print("ready", flush=True)
    clock = NextBubbleClock()
    edge: Edge | None = last
    while True:
        if mode.startswith("wait+spin"):
            edge = _anticipate(reader, clock, edge, last_seq, fixed=mode == "wait+spin-fixed")
        elif poll_s is None:
            edge = reader.wait(timeout_s=30, after_seq=last_seq)
        else:
            edge = reader.latest()
            if edge is None or edge.seq <= last_seq:
                time.sleep(poll_s)
                continue
        seen_ns = time.time_ns()
        if edge is None or edge.phase is Phase.CLOSED:
            break
        last_seq = edge.seq
        seen.append((edge.seq, seen_ns))
    cpu_s = time.process_time()
    out.write_text(json.dumps({"seen": seen, "cpu_s": cpu_s}))


def _anticipate(
    reader: EdgeReader, clock: NextBubbleClock, last: Edge | None, last_seq: int, *, fixed: bool
) -> Edge | None:
    """The next edge, sleeping until just before it is expected and spinning across it (as
    ``TaskHost._wait_for_edge`` does for starts; ``fixed``: 300 µs either side)."""
    lead_ns = round(SPIN_LEAD_S * 1e9)
    window = None
    if last is not None and last.in_bubble:
        if last.predicted_end_ns is not None:
            window = (last.predicted_end_ns - lead_ns, last.predicted_end_ns + lead_ns)
    elif fixed:
        expected = clock.next_start_ns()
        window = None if expected is None else (expected - lead_ns, expected + lead_ns)
    else:
        window = clock.spin_window(lead_ns, round(SPIN_MOST_S * 1e9))
    edge = None
    if window is not None:
        sleep_s = (window[0] - reader.now_ns()) / 1e9
        if sleep_s > 0:
            edge = reader.wait(timeout_s=sleep_s, after_seq=last_seq)
        if edge is None:
            spin_s = (window[1] - reader.now_ns()) / 1e9
            edge = reader.wait(timeout_s=30, after_seq=last_seq, spin_s=spin_s)
    else:
        edge = reader.wait(timeout_s=30, after_seq=last_seq)
    if edge is not None and edge.in_bubble:
        clock.bubble_started(start_ns=edge.start_ns, previous_slot=edge.previous_slot,
                             previous_end_ns=edge.previous_end_ns)  # fmt: skip
    elif edge is not None and edge.phase is Phase.BUSY and edge.observed_end_ns is not None:
        clock.bubble_ended(slot=edge.slot, end_ns=edge.observed_end_ns)
    return edge


def measure(
    mode: str,
    writer_mode: str,
    edges: int,
    workdir: Path,
    seed: int,
    *,
    blocks: int = 0,
    jitter_ms: float = 0.5,
) -> dict[str, Any]:
    """One writer → one reader run; latency and writer-cost statistics in µs (and, with
    ``blocks`` ≥ 5, per-block means of the start latency with their intervals)."""
    path = workdir / f"{writer_mode}-{mode}.edge"
    out = workdir / f"{writer_mode}-{mode}.json"
    writer = EdgeWriter.create(path)
    proc = subprocess.Popen(
        [sys.executable, __file__, "--reader", mode, "--path", str(path), "--reader-out", str(out)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError(f"reader {mode} did not start; exit code {proc.wait()}")
    rng = random.Random(seed)
    sent: dict[int, int] = {}
    cost_ns: list[int] = []
    slots = len(PIPELINE_IDLE_MS)
    t_start = time.perf_counter()
    for i in range(edges):
        slot, starts = (i // 2) % slots, i % 2 == 0
        if writer_mode.startswith("pipeline"):  # before a start: compute; before an end: idle
            ms = PIPELINE_BUSY_MS[slot - 1] if starts else PIPELINE_IDLE_MS[slot]
            jitter = jitter_ms / 2 if writer_mode == "pipeline-jitter" and starts else 0.0
            jitter = jitter or PIPELINE_JITTER_MS
            gap_s = (ms + rng.uniform(-jitter, jitter)) / 1e3
            step = i // (2 * slots)
        else:
            gap_s = rng.uniform(0.001, 0.003)
            slot, step = 0, i // 2
        if writer_mode == "sleep":
            time.sleep(gap_s)
        else:  # a rank computing between edges: its CPU stays busy and warm
            until = time.perf_counter() + gap_s
            while time.perf_counter() < until:
                pass
        t_ns = time.time_ns()
        c0 = time.perf_counter_ns()
        if starts:
            idle_ms = PIPELINE_IDLE_MS[slot] if writer_mode.startswith("pipeline") else 2.0
            length_ns = int(idle_ms * 1e6)
            writer.bubble_start(step=step, slot=slot, t_ns=t_ns, predicted_end_ns=t_ns + length_ns)
        else:
            writer.bubble_end(step=step, slot=slot, t_ns=t_ns)
        cost_ns.append(time.perf_counter_ns() - c0)
        sent[i + 1] = t_ns
    time.sleep(0.05)
    wall_s = time.perf_counter() - t_start
    writer.close()
    proc.wait(timeout=60)
    reader_out = json.loads(out.read_text())
    seen = reader_out["seen"]
    # Latency of edge i = when the reader first saw edge i or a later one (a polling reader
    # can miss an edge that a newer one replaced; it still learns the newer state then).
    lat_us, start_us, j = [], [], 0
    for seq in sorted(sent):
        while j < len(seen) and seen[j][0] < seq:
            j += 1
        if j < len(seen):
            lat_us.append((seen[j][1] - sent[seq]) / 1e3)
            if seq % 2 == 1:  # edge i = seq - 1 is a bubble start when i is even
                start_us.append(lat_us[-1])
    observed = {seq for seq, _ in seen}
    result = {
        "reader": mode,
        "writer": writer_mode,
        "edges_sent": edges,
        "edges_seen_exactly": len(observed & set(sent)),
        "edges_superseded": edges - len(observed & set(sent)),
        "latency_us": _stats(np.array(lat_us)),
        "start_latency_us": _stats(np.array(start_us)),
        "writer_call_us": _stats(np.array(cost_ns) / 1e3),
        "reader_cpu_frac": round(reader_out["cpu_s"] / wall_s, 3),
    }
    if blocks:
        result["start_blocks"] = _block_means(start_us[len(start_us) // 10 :], blocks)
    return result


def _block_means(start_us: list[float], blocks: int) -> dict[str, Any]:
    """Per block of consecutive starts (the first tenth left out: the clock is learning):
    p50, p90 and the share seen within ``NO_WAKE_US``; their means with 95% t-intervals."""
    if blocks < 5:
        raise SystemExit(f"--blocks {blocks}: an interval needs at least 5 blocks")
    parts = [np.asarray(b) for b in np.array_split(np.asarray(start_us), blocks) if len(b)]
    figures = {
        "p50_us": [float(np.percentile(b, 50)) for b in parts],
        "p90_us": [float(np.percentile(b, 90)) for b in parts],
        "no_wake_frac": [float(np.mean(b <= NO_WAKE_US)) for b in parts],
    }
    out: dict[str, Any] = {"blocks": len(parts), "starts_per_block": len(parts[0])}
    for name, values in figures.items():
        iv = mean_interval(values)
        out[name] = {"value": round(iv.value, 3), "lo": round(iv.lo, 3), "hi": round(iv.hi, 3)}
    return out


_PIPE_READER = """
import json, os, sys, time
seen = []
while True:
    b = os.read(0, 1)
    t = time.time_ns()
    if not b or b == b"q":
        break
    seen.append(t)
sys.stdout.write(json.dumps(seen))
"""


def measure_pipe_floor(edges: int, seed: int) -> dict[str, Any]:
    """The wake-up floor of this machine: a busy writer writes a byte, a reader blocks in read.

    No shared memory and no record, just the kernel waking a sleeping Python process; an edge's
    wake-up (a byte in the reader's FIFO) runs above it by the record's own work.
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", _PIPE_READER], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdin is not None
    fd = proc.stdin.fileno()
    time.sleep(0.5)  # let the reader start and block (a warm-up, not a synchronisation)
    rng = random.Random(seed)
    sent = []
    for _ in range(edges):
        until = time.perf_counter() + rng.uniform(0.001, 0.003)
        while time.perf_counter() < until:
            pass
        sent.append(time.time_ns())
        os.write(fd, b"x")
    os.write(fd, b"q")
    out, _ = proc.communicate(timeout=60)
    seen = json.loads(out)
    lat_us = np.array([(s - t) / 1e3 for s, t in zip(seen, sent, strict=False)])
    return {"reader": "pipe read (floor)", "writer": "busy", "latency_us": _stats(lat_us)}


def writer_cost_hot(workdir: Path, calls: int = 20_000) -> dict[str, float]:
    """One writer call back to back (warm caches, no reader waiting), in µs."""
    writer = EdgeWriter.create(workdir / "hot.edge")
    cost_ns = []
    for i in range(calls):
        c0 = time.perf_counter_ns()
        writer.bubble_start(step=i, slot=0, t_ns=i, predicted_end_ns=i + 1)
        cost_ns.append(time.perf_counter_ns() - c0)
    writer.close()
    return _stats(np.array(cost_ns) / 1e3)


def _stats(x: np.ndarray) -> dict[str, float]:
    if x.size == 0:
        return {k: float("nan") for k in ("p50", "p90", "p99", "max", "mean")}
    return {
        "p50": round(float(np.percentile(x, 50)), 1),
        "p90": round(float(np.percentile(x, 90)), 1),
        "p99": round(float(np.percentile(x, 99)), 1),
        "max": round(float(x.max()), 1),
        "mean": round(float(x.mean()), 1),
    }


def machine() -> dict[str, Any]:
    """What this ran on, for the results file."""
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
    }


def _default_note(info: dict[str, Any]) -> str:
    if (info["cpu_count"] or 0) <= 2:
        return (
            "Shared 2-core CPU box (no GPU), with other engineers' builds and tests running at "
            "the same time: wake-up latency here is mostly scheduler delay and varies between "
            "runs; a busy writer takes one of the two cores."
        )
    return (
        f"{info['cpu_count']}-core machine, load average {info['load_avg_1m_at_start']} at start."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edges", type=int, default=2000, help="edges per reader mode")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results JSON")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--note", default="", help="what to say about the machine in the results")
    ap.add_argument("--readers", nargs="+", choices=MODES, default=list(MODES), help="readers")
    ap.add_argument("--writers", nargs="+", choices=WRITERS, default=list(WRITERS), help="writers")
    ap.add_argument(
        "--blocks",
        type=int,
        default=0,
        help="also block means of the start latency with intervals (>= 5 blocks)",
    )
    ap.add_argument(
        "--jitter-ms",
        type=float,
        default=0.5,
        help="pipeline-jitter: the compute gaps' spread (uniform, +- half)",
    )
    ap.add_argument("--reader", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--path", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--reader-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.reader:
        run_reader(args.path, args.reader, args.reader_out)
        return
    info = machine()
    with tempfile.TemporaryDirectory(prefix="edge-bench-") as tmp:
        runs = {
            f"{writer}/{mode}": measure(
                mode,
                writer,
                args.edges,
                Path(tmp),
                args.seed,
                blocks=args.blocks,
                jitter_ms=args.jitter_ms,
            )
            for writer in args.writers
            for mode in args.readers
        }
        hot = writer_cost_hot(Path(tmp))
        floor = measure_pipe_floor(args.edges, args.seed)
    ratios = {
        f"{writer}/{mode}": {
            f"{q}_vs_wait": round(
                runs[f"{writer}/{mode}"]["latency_us"][q] / runs[f"{writer}/wait"]["latency_us"][q],
                1,
            )
            for q in ("p50", "p99")
        }
        for writer in args.writers
        for mode in args.readers
        if mode != "wait" and "wait" in args.readers
    }
    result = {
        "benchmark": "edge_latency",
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": info,
        "note": args.note or _default_note(info),
        "goal": "wait p50 <= 50 us, p99 <= 200 us; FreeRide's reference needs 5-15 ms "
        "(5 ms runner poll, 10 ms manager tick, synchronous gRPC)",
        "writers": {
            "busy": "the writer spins between edges, like a rank that computes (warm CPU)",
            "sleep": "the writer sleeps between edges (cold caches and an idle vCPU to wake)",
            "pipeline": "a busy writer with a periodic step of four bubbles (idle "
            f"{PIPELINE_IDLE_MS} ms, compute {PIPELINE_BUSY_MS} ms, +-{PIPELINE_JITTER_MS} ms)",
            "pipeline-jitter": "the pipeline's step with each compute gap jittered uniformly "
            f"by +-{args.jitter_ms / 2} ms",
        },
        "runs": runs,
        "ratios": ratios,
        "writer_call_back_to_back_us": hot,
        "wake_up_floor": floor,
    }
    cpus = f"{info['cpu_count']} CPUs ({info['cpu_model']}), load {info['load_avg_1m_at_start']}"
    print(f"edge latency, {args.edges} edges per run, {cpus}")
    head = f"{'writer/reader':<20} {'p50 us':>9} {'p90 us':>9} {'p99 us':>9} {'max us':>9}"
    print(f"{head} {'start p50':>10} {'superseded':>11} {'write p50 us':>13}")
    for name, run in runs.items():
        lat = run["latency_us"]
        print(
            f"{name:<20} {lat['p50']:>9.1f} {lat['p90']:>9.1f} {lat['p99']:>9.1f} "
            f"{lat['max']:>9.1f} {run['start_latency_us']['p50']:>10.1f} "
            f"{run['edges_superseded']:>11} {run['writer_call_us']['p50']:>13}"
        )
    for name, run in runs.items():
        if "start_blocks" in run:
            b = run["start_blocks"]
            print(
                f"{name}: {b['blocks']} blocks of {b['starts_per_block']} starts: p50 "
                f"{b['p50_us']['value']:.1f} [{b['p50_us']['lo']:.1f}, {b['p50_us']['hi']:.1f}]"
                f" us, p90 {b['p90_us']['value']:.1f} us, seen within {NO_WAKE_US:g} us "
                f"{b['no_wake_frac']['value']:.0%}, reader CPU {run['reader_cpu_frac']:.0%}"
            )
    for name, r in ratios.items():
        print(f"{name} / wait: p50 x{r['p50_vs_wait']}, p99 x{r['p99_vs_wait']}")
    print(f"writer call back to back (warm, no waiter): p50 {hot['p50']} us, p99 {hot['p99']} us")
    fl = floor["latency_us"]
    print(f"wake-up floor (pipe byte, blocking read): p50 {fl['p50']} us, p99 {fl['p99']} us")
    write_results(result, args.out)


if __name__ == "__main__":
    main()
