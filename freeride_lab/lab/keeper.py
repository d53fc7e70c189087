"""The keeper of a detached run: ``python -m freeride_lab.lab.keeper --config JSON``.

``freeride-lab launch`` returns at once, but a run needs an owner: something that holds its bus,
starts and always stops its MPS daemon, and notices when it ends. The CLI starts this small
process in a new session (so the shell's Ctrl-C and hang-up do not reach it); it calls
``Session.launch(..., detached=True)``, serves the run's request channel (``lab.owner_channel``:
the attach, tune, move, checkpoint and detach that other processes ask for, carried out by its
owning Session; the address goes into run.json as ``"keeper"``), writes one JSON line to stdout
(``{"run_dir", "run_id"}`` or ``{"error"}``) for the CLI to print, then waits for the run to end
and stops it (MPS included) like any owner. SIGTERM makes it stop the run (that is what
``Session.stop`` on an observer of a detached run sends); SIGINT and SIGHUP are ignored.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from freeride_lab.core.config import RunConfig
from freeride_lab.lab.owner_channel import OwnerServer
from freeride_lab.lab.session import Session

log = logging.getLogger(__name__)

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Launch the run, report where it is, keep it until it ends; the exit code."""
    parser = argparse.ArgumentParser(prog="python -m freeride_lab.lab.keeper")
    parser.add_argument("--config", required=True, help="RunConfig.to_dict() as JSON")
    parser.add_argument("--run-dir", default=None, type=Path)
    parser.add_argument("--grace-s", type=float, default=10.0)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        config = RunConfig.from_dict(json.loads(args.config))
        session = Session.launch(config, run_dir=args.run_dir, grace_s=args.grace_s, detached=True)
    except Exception as exc:  # reported to the CLI, which prints one line
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 2
    try:
        server = _serve_requests(session)
    except Exception as exc:  # a run nobody could command: end it rather than keep it
        session.stop()
        print(json.dumps({"error": f"no request channel: {type(exc).__name__}: {exc}"}), flush=True)
        return 2
    logging.basicConfig(
        level=logging.INFO,
        filename=str(session.run_dir.logs_dir / "keeper.log"),
        format="%(asctime)s keeper %(levelname)s %(name)s: %(message)s",
    )
    print(json.dumps({"run_dir": str(session.run_dir.path), "run_id": session.run_id}), flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # the CLI has gone: nothing may write to its pipe
    os.close(devnull)
    while not stop.is_set():
        try:
            session.wait(timeout_s=0.5)
            break
        except TimeoutError:
            continue
    log.info("keeper: %s", "stop requested" if stop.is_set() else "the run ended")
    server.close()
    session.stop()
    return 0


def _serve_requests(session: Session) -> OwnerServer:
    """Start the run's request channel and name it in run.json (``"keeper"``)."""
    rd = session.run_dir
    server = OwnerServer(session, rd.secret()).start()
    try:
        run = rd.read_run()
        run["keeper"] = {"address": list(server.address), "pid": os.getpid()}
        rd.write_json(rd.run_json, run)
    except BaseException:
        server.close()
        raise
    return server


if __name__ == "__main__":
    sys.exit(main())
