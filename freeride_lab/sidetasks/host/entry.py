"""The task process's entry point: ``python -m freeride_lab.sidetasks.host --spec JSON``.

The worker starts it through ``TaskProcess`` (limits already in the environment, before any CUDA
call); it wires the task's event file, control channel and beacon to a ``TaskHost`` and runs it.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
from multiprocessing.connection import Connection
from pathlib import Path

from freeride_lab.core.runtime_options import RuntimeOptions
from freeride_lab.io.rundir import RunDir
from freeride_lab.io.sink import EventSink
from freeride_lab.sidetasks.heartbeat import TaskBeacon
from freeride_lab.sidetasks.host.base import log
from freeride_lab.sidetasks.host.task_host import TaskHost
from freeride_lab.sidetasks.spec import HostSpec

__all__ = ["main"]


def _task_sink(spec: HostSpec) -> EventSink:
    """The task's own event file, ``events/task-<id>.jsonl``, wired to the run's bus if any."""
    run_dir = RunDir(Path(spec.run_dir))
    path = run_dir.events_dir / f"task-{spec.task.task_id}.jsonl"
    bus = None
    try:
        address = run_dir.read_run().get("bus", {}).get("address")
        if address:
            bus = ((str(address[0]), int(address[1])), run_dir.secret())
    except (OSError, ValueError):
        bus = None
    return EventSink(path, bus=bus)


def _runtime_options(spec: HostSpec) -> RuntimeOptions:
    """The run's ``RuntimeOptions`` (step groups, what to do past a predicted end); the
    defaults where run.json has none or they are unreadable."""
    try:
        runtime = RunDir(Path(spec.run_dir)).read_run().get("config", {}).get("runtime") or {}
        return RuntimeOptions.from_dict(dict(runtime))
    except (OSError, ValueError, TypeError) as exc:
        options = RuntimeOptions()
        log.warning("run.json's runtime options unreadable (%s); step groups of %g ms, "
                    "outlived %r", exc, options.step_group_ms, options.outlived)  # fmt: skip
        return options


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m freeride_lab.sidetasks.host``."""
    parser = argparse.ArgumentParser(prog="python -m freeride_lab.sidetasks.host")
    parser.add_argument("--spec", required=True, help="HostSpec as JSON (see HostSpec.to_dict)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a notebook Interrupt must not kill side tasks
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s task_host[%(process)d] %(levelname)s %(name)s: %(message)s",
    )
    spec = HostSpec.from_dict(json.loads(args.spec))
    conn = Connection(spec.control_fd) if spec.control_fd >= 0 else None
    beacon = TaskBeacon.attach(spec.beacon_fd) if spec.beacon_fd >= 0 else None
    sink = _task_sink(spec)
    options = _runtime_options(spec)
    host = TaskHost(
        spec, conn=conn, sink=sink, beacon=beacon,
        step_group_ns=round(options.step_group_ms * 1e6), outlived=options.outlived,
        peers=options.predictor == "peers",
    )  # fmt: skip
    signal.signal(signal.SIGTERM, lambda signum, frame: host.request_stop("SIGTERM"))
    try:
        code = host.run()
    finally:
        sink.close()
    # the task's end is recorded: a late SIGTERM must not turn it into "killed by SIGTERM"
    # (the interpreter restores default handlers on its way out)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log.info("task %s exits in state %s", spec.task.task_id, host.machine.state)
    log.info("task %s: %s", spec.task.task_id, host.overrun_stats().describe())
    return code
