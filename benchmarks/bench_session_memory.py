"""What the session's tables keep per event, and what building a table costs, old vs new.

    python benchmarks/bench_session_memory.py            # 200,000 events; ~1 min on 2 cores
    python benchmarks/bench_session_memory.py --events 50000 --out /tmp/x.json

Feeds N synthetic events with the mix of a 2-stage 1F1B run with a chatty side task (per rank
and step: 8 ``ActionTimed``, 18 ``BubbleEdge``, a ``StepTimed``, a ``MemoryReport``; for the
side task about 3 ``SideTaskStep``, 2 ``SideTaskStateChanged`` and a ``ControlAck`` per step),
each decoded from its JSON line as the tailer does, in batches of 64 (a poll), into:

- ``old``: the list-of-dicts store that ``EventTables`` was before (a copy of it is below: it
  kept every event dict and rebuilt each table from all of them);
- ``new``: ``freeride_lab.lab.tables.EventTables`` (packed columns and a compressed log).

Per store: bytes kept per event (``tracemalloc``, in a pass of its own; again with the
actions, steps and side_task_steps tables built, which both stores cache), feeding time per
event, and table-build time: ``cold`` (first build after all events) and ``live`` (add one
poll of 64 events, then rebuild actions + side_task_steps, as a dashboard does every tick).
The tables of both stores are checked equal before anything is timed. Ratios old/new are
printed side by side; the JSON goes to ``results/session-memory-cpu-<date>.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
from bench_output import write_results

from freeride_lab.core import events as ev
from freeride_lab.lab.tables import (
    EventTables,
    actions_frame,
    side_task_steps_frame,
    steps_frame,
)

RESULTS = Path(__file__).parent / "results"
POLL = 64  # events per add(), about one poll of a live run
T0 = 1_796_235_364_000_000_000


class OldEventTables:
    """The store ``EventTables`` was before: every event dict in a list, tables rebuilt from
    all of them whenever any event arrived (trimmed to what this benchmark uses)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.t0_ns: int | None = None
        self._cache: dict[str, tuple[int, pd.DataFrame]] = {}

    def add(self, events: list[dict[str, Any]]) -> int:
        for e in events:
            self.events.append(e)
            if e.get("kind") == "rank_started":
                t = int(e["t_ns"])
                self.t0_ns = t if self.t0_ns is None else min(self.t0_ns, t)
        return len(events)

    def actions(self) -> pd.DataFrame:
        return self._frame("actions", lambda: actions_frame(self.events, self.t0_ns))

    def steps(self) -> pd.DataFrame:
        return self._frame("steps", lambda: steps_frame(self.events, self.t0_ns))

    def side_task_steps(self) -> pd.DataFrame:
        return self._frame(
            "side_task_steps", lambda: side_task_steps_frame(self.events, self.t0_ns)
        )

    def _frame(self, name: str, build: Callable[[], pd.DataFrame]) -> pd.DataFrame:
        n = len(self.events)
        hit = self._cache.get(name)
        if hit is None or hit[0] != n:
            hit = (n, build())
            self._cache[name] = hit
        return hit[1].copy()


def synthetic_lines(n: int) -> Iterator[bytes]:
    """``n`` JSON lines of a 2-stage 1F1B run (4 micro-batches) with a chatty side task."""
    yield from (
        ev.to_json(
            ev.RankStarted(
                rank=r, world_size=2, stages=(r,), pid=100 + r, host="vm", device="cpu", t_ns=T0
            )
        ).encode()
        for r in (0, 1)
    )
    count, step, t = 2, 0, T0 + 10_000_000
    while True:
        batch: list[ev.Event] = []
        for rank in (0, 1):
            clock = t
            for slot in range(9):
                batch.append(ev.BubbleEdge(rank=rank, stage=rank, step=step, slot=slot,
                                           edge="start", t_ns=clock))  # fmt: skip
                clock += 3_000_000 + 17 * slot
                batch.append(ev.BubbleEdge(rank=rank, stage=rank, step=step, slot=slot,
                                           edge="end", t_ns=clock, predicted_end_ns=clock + 5,
                                           label="A" if slot == 0 else None))  # fmt: skip
                if slot < 8:
                    kind, mb = ("F", slot // 2) if slot % 2 == 0 else ("B", slot // 2)
                    batch.append(ev.ActionTimed(rank=rank, stage=rank, step=step, action=kind,
                                                microbatch=mb, start_ns=clock,
                                                end_ns=clock + 20_000_123))  # fmt: skip
                    clock += 20_000_123
            batch.append(ev.StepTimed(rank=rank, step=step, start_ns=t, end_ns=clock,
                                      optimizer_start_ns=clock, optimizer_end_ns=clock + 99_000,
                                      loss=2.5 - step * 1e-4 if rank == 1 else None,
                                      tokens=64))  # fmt: skip
            batch.append(ev.MemoryReport(rank=rank, step=step, peak_reserved_bytes=495_493_120,
                                         capacity_bytes=25_275_990_016, device="cpu"))  # fmt: skip
        for i in range(3 + (step % 3 == 0)):
            start = t + i * 40_000_000
            batch.append(ev.SideTaskStep(task_id="counting-4d71", name="Counting", stage=0,
                                         rank=0, step=step, start_ns=start,
                                         end_ns=start + 2_100_000, progress=1.0,
                                         unit="iterations",
                                         overrun_ns=1_487_419 if i == 0 else 0))  # fmt: skip
        for state, event in (("PAUSED", "PAUSE"), ("RUNNING", "START")):
            batch.append(
                ev.SideTaskStateChanged(
                    task_id="counting-4d71", name="Counting", stage=0, state=state, t_ns=t + 7,
                    event=event,
                )
            )  # fmt: skip
        if step % 3 == 0:
            batch.append(
                ev.ControlAck(
                    command="tune", t_ns=t + 9, ok=True, message="budget_s=0.005",
                    payload={"restarted": False},
                )
            )  # fmt: skip
        for e in batch:
            if count >= n:
                return
            yield ev.to_json(e).encode()
            count += 1
        step += 1
        t += 330_000_000


def polls(lines: list[bytes]) -> Iterator[list[dict[str, Any]]]:
    """Fresh dicts, decoded per poll like ``EventTailer`` does."""
    for i in range(0, len(lines), POLL):
        yield [json.loads(line) for line in lines[i : i + POLL]]


def kept_bytes(make: Callable[[], Any], lines: list[bytes], *, built: bool = False) -> int:
    """Bytes the store holds after taking every line (tracemalloc, allocations still alive);
    ``built``: also with its actions, steps and side_task_steps tables built (and cached)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    store = make()
    for batch in polls(lines):
        store.add(batch)
    if built:
        store.actions(), store.steps(), store.side_task_steps()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del store
    return after - before


def timings(make: Callable[[], Any], lines: list[bytes], live_polls: int) -> dict[str, float]:
    """Feeding time per event; cold and live table-build times (ms)."""
    head, tail = lines[: len(lines) - live_polls * POLL], lines[len(lines) - live_polls * POLL :]
    batches = list(polls(head))
    store = make()
    t = time.perf_counter()
    for batch in batches:
        store.add(batch)
    add_s = time.perf_counter() - t
    t = time.perf_counter()
    store.actions(), store.side_task_steps(), store.steps()
    cold_s = time.perf_counter() - t
    live: list[float] = []
    for batch in polls(tail):
        store.add(batch)
        t = time.perf_counter()
        store.actions(), store.side_task_steps()
        live.append(time.perf_counter() - t)
    return {
        "add_us_per_event": add_s / max(1, len(head)) * 1e6,
        "cold_build_ms": cold_s * 1e3,
        "live_build_ms_median": statistics.median(live) * 1e3,
        "live_build_ms_max": max(live) * 1e3,
    }


def check_same_tables(lines: list[bytes]) -> None:
    old, new = OldEventTables(), EventTables()
    for batch in polls(lines):
        old.add(batch)
        new.add(json.loads(json.dumps(batch)))
    for name in ("actions", "steps", "side_task_steps"):
        pd.testing.assert_frame_equal(getattr(old, name)(), getattr(new, name)())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--live-polls", type=int, default=20, help="polls timed after the feed")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    lines = list(synthetic_lines(args.events))
    kinds: dict[str, int] = {}
    for line in lines:
        kind = json.loads(line)["kind"]
        kinds[kind] = kinds.get(kind, 0) + 1
    check_same_tables(lines[: min(len(lines), 30_000)])
    stores: dict[str, Callable[[], Any]] = {"old": OldEventTables, "new": EventTables}
    result: dict[str, dict[str, float]] = {}
    for name, make in stores.items():
        kept = kept_bytes(make, lines)
        with_tables = kept_bytes(make, lines, built=True)
        result[name] = {
            "bytes_per_event": kept / len(lines),
            "bytes_per_event_with_tables_built": with_tables / len(lines),
            **timings(make, lines, args.live_polls),
        }
        print(f"{name}: " + ", ".join(f"{k}={v:.3g}" for k, v in result[name].items()), flush=True)
    ratios = {k: result["old"][k] / result["new"][k] for k in result["new"] if result["new"][k]}
    print("old/new: " + ", ".join(f"{k}={v:.3g}" for k, v in ratios.items()))
    record = {
        "benchmark": "session-memory",
        "command": "python " + " ".join(["benchmarks/bench_session_memory.py", *sys.argv[1:]]),
        "date": datetime.now(UTC).date().isoformat(),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": "2-core CPU VM, no GPU",
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pandas": pd.__version__,
        "note": "shared machine: timings are noisy upper bounds; bytes are tracemalloc's",
        "events": len(lines),
        "poll_events": POLL,
        "mix": kinds,
        "old": result["old"],
        "new": result["new"],
        "old_over_new": ratios,
    }
    write_results(record, args.out or RESULTS / f"session-memory-cpu-{record['date']}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
