"""The training rank: ``python -m freeride_lab.pipeline.rank --run-dir DIR`` under torchrun.

One process per pipeline rank, started by ``python -m torch.distributed.run`` (which sets
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``). It reads the
``RunConfig`` from ``DIR/run.json``, joins the process group (gloo on CPU, NCCL on CUDA), builds
its stage chunk(s), wraps each in a ``TimedPipelineStage`` and trains for ``config.steps`` steps
with the configured ``torch.distributed.pipelining`` schedule, writing events to
``DIR/events/rank-<r>.jsonl``:

    RankStarted                        first, after the process group and clock sync are up
                                       (clock offset, its uncertainty and round trip)
    per step: ActionTimed x actions    one per F/B/I/W this rank ran, in start order
              StepTimed                schedule window, optimizer span, loss (last stage), tokens
              MemoryReport             CUDA: peak reserved / device total; CPU: RSS / RAM
              BubbleEdge x edges       only when a live edges receiver is configured
    RankFinished                       last, after a normal end or a graceful stop
    RankFailed                         instead, on an exception or an aborted stop (exit code 1)

Signals: SIGINT is ignored (a notebook Interrupt must not kill training). SIGTERM asks for a
graceful stop: all ranks agree at the next step boundary and finish; if the current step does
not end within ``config.runtime.stop_grace_s`` (default 10 s, e.g. because a peer died), the rank
writes RankFailed and exits. A parent-death watchdog turns the launcher's death into SIGTERM.

``config.runtime`` (``core.runtime_options.RuntimeOptions``) fields read here:
    timed: True (default) | False (plain ``PipelineStage``, no ActionTimed) | "alternate"
        (blocks of ``alternate_every`` steps, default 1, alternately timed and plain, timed
        first, in the same processes; for the overhead benchmark)
    stop_grace_s: float, default 10
    pg_timeout_s: float, default 600 (collective timeout)
    edges_factory: "module:callable" called as ``f(run_dir=RunDir, rank=int)`` → BubbleEdges
    emulate: ``EmulateOptions`` or None: single-GPU emulation (every rank
        builds its real chunk on one device, one rank computes per step, the others sleep its
        calibrated costs; see that module)
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import traceback
from pathlib import Path

from freeride_lab.core.config import RunConfig
from freeride_lab.core.events import RankFailed, RankFinished
from freeride_lab.io.rundir import RunDir
from freeride_lab.io.sink import EventSink
from freeride_lab.pipeline.rank_env import RankEnv
from freeride_lab.pipeline.runner import RankRunner
from freeride_lab.pipeline.stop import StopControl

log = logging.getLogger(__name__)

__all__ = ["RankEnv", "RankRunner", "main"]

# Once a rank has recorded how it ended, closing (watcher, edges receiver, process group) gets
# this long before the process leaves anyway: a dead launcher took the rendezvous store along.
_CLOSE_LIMIT_S = 10.0


def _error_line(exc: BaseException) -> str:
    """One line naming the error and its causes: ``Type: first line <- Cause: first line``."""
    parts: list[str] = []
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen and len(parts) < 4:
        seen.add(id(e))
        first = next((x.strip() for x in str(e).splitlines() if x.strip()), "")
        parts.append(f"{type(e).__name__}: {first}" if first else type(e).__name__)
        e = e.__cause__ or e.__context__
    return " <- ".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code (0 ok, 1 failed or aborted)."""
    parser = argparse.ArgumentParser(
        prog="python -m freeride_lab.pipeline.rank",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--run-dir", required=True, type=Path, help="run directory with run.json")
    parser.add_argument(
        "--plain",
        action="store_true",
        help="use plain PipelineStage (no action timing), for benchmarks",
    )
    parser.add_argument("--log-level", default=os.environ.get("FREERIDE_LOG_LEVEL", "INFO"))
    ns = parser.parse_args(argv)
    env = RankEnv()
    logging.basicConfig(
        level=ns.log_level.upper(),
        format=f"%(asctime)s rank{env.rank} %(levelname)s %(name)s: %(message)s",
    )
    run_dir = RunDir(ns.run_dir)
    stop = StopControl()
    stop.install()
    sink = (
        EventSink.for_rank(run_dir, env.rank)  # also forwards to the live bus, when one is set
        if hasattr(EventSink, "for_rank")
        else EventSink(run_dir.rank_events(env.rank))
    )

    runner: RankRunner | None = None

    def fail(message: str, tb: str = "") -> None:
        offset = runner.clock_offset_ns if runner is not None else 0
        sink.emit(
            RankFailed(rank=env.rank, t_ns=time.time_ns() + offset, error=message, traceback=tb)
        )
        sink.close()

    stop.on_abort = fail
    try:
        config = RunConfig.from_dict(run_dir.read_run()["config"])
        stop.grace_s = config.runtime.stop_grace_s
        runner = RankRunner(
            config, env, run_dir, emit=sink.emit, stop=stop, timed=False if ns.plain else None
        )
        runner.setup()
        sink.emit(runner.started_event())
        steps = runner.run()
        stop.done()
        offset = runner.clock_offset_ns
        sink.emit(
            RankFinished(
                rank=env.rank,
                steps=steps,
                t_ns=time.time_ns() + offset,
                dropped_events=sink.dropped,
            )
        )
        sink.close()
        stop.exit_within(_CLOSE_LIMIT_S, code=0)  # the end is recorded; closing may not hang us
        runner.close()
        return 0
    except BaseException as exc:
        stop.done()
        line = _error_line(exc)
        log.exception("rank %d failed", env.rank)
        fail(line, traceback.format_exc())
        stop.exit_within(_CLOSE_LIMIT_S, code=1)
        if runner is not None:
            # The process group is left to process exit: destroying it can hang when a peer died.
            runner.close(destroy_group=False)
        return 1


if __name__ == "__main__":
    # [Note: fast exit] Events are closed and the process group destroyed by now; skipping the
    # interpreter's teardown of torch's modules saves seconds per rank on a small CPU box.
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
