"""Faults a rank process installs on itself for the bubble-attribution runs.

The rank imports ``install`` by name as its ``edges_factory`` (``RunConfig.runtime``), which it
calls before it builds its stages. ``install`` reads two keys of the run's ``notes``:

    slow_forward: {"stage": s, "extra_ms": x}  stage s's forward sleeps x ms more, inside the
        timed F (a slow stage)
    send_delay: {"stage": s, "delay_ms": d, "microbatch": j}  after F of micro-batch j (every
        micro-batch without "microbatch") of stage s ends, the rank sleeps d ms before torch
        posts the F's send (a late send)

and returns a bubble-edge receiver that accepts everything. Each sleep's real length (ns; a
busy box oversleeps) goes on a line of ``logs/sleeps-rank<r>.txt``, in call order.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

from torch.distributed.pipelining import PipelineStage

from freeride_lab.io.rundir import RunDir
from freeride_lab.pipeline.timed_stage import TimedPipelineStage
from tests.edge_receivers import QuietEdges


def install(*, run_dir: RunDir, rank: int) -> QuietEdges:
    """Patch this rank process's stage classes as the run's ``notes`` ask."""
    notes = run_dir.read_run()["config"].get("notes", {})
    slow = notes.get("slow_forward")
    log = run_dir.logs_dir / f"sleeps-rank{rank}.txt"
    if slow:
        _sleep_around(PipelineStage, int(slow["stage"]), float(slow["extra_ms"]), log, before=True)
    late = notes.get("send_delay")
    if late:
        mb = late.get("microbatch")
        _sleep_around(
            TimedPipelineStage,
            int(late["stage"]),
            float(late["delay_ms"]),
            log,
            before=False,
            microbatch=None if mb is None else int(mb),
        )
    return QuietEdges()


def _sleep_around(
    cls: type, stage: int, ms: float, log: Path, *, before: bool, microbatch: int | None = None
) -> None:
    """Make ``cls.forward_one_chunk`` of ``stage`` sleep ``ms`` before or after the call."""
    original = cls.forward_one_chunk  # type: ignore[attr-defined]

    def sleep() -> None:
        t0 = time.perf_counter_ns()
        time.sleep(ms / 1e3)
        with log.open("a") as f:
            f.write(f"{time.perf_counter_ns() - t0}\n")

    @functools.wraps(original)
    def forward_one_chunk(self: Any, chunk: int, *args: Any, **kwargs: Any) -> Any:
        hit = self.stage_index == stage and microbatch in (None, chunk)
        if before and hit:
            sleep()
        out = original(self, chunk, *args, **kwargs)
        if not before and hit:
            sleep()
        return out

    cls.forward_one_chunk = forward_one_chunk  # type: ignore[attr-defined]
