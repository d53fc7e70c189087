"""``RunMps``: the private MPS daemon of one run, as the run's owner starts and stops it.

    mps = RunMps(config, run_dir)
    entry = mps.start()        # run.json's "mps": {"active": bool, "reason": ..., dirs}
    env.update(mps.client_env())   # the launcher (and so ranks, workers, tasks) are its clients
    ...                        # the run
    mps.stop(leftovers=session_processes, grace_s=10)   # after every process exited

See ``lab.session`` [Note: MPS daemon] for when a run gets one. The pipe directory lives under
``<run_dir>/mps/pipe`` unless that path is too long for the daemon's Unix sockets; then it is
a private ``/tmp/freeride-mps-*`` directory (mode 0700), removed at ``stop``.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from freeride_lab.core.config import RunConfig
from freeride_lab.gpu.mps import MpsDaemon
from freeride_lab.io.rundir import RunDir
from freeride_lab.pipeline.launcher import stop_processes

log = logging.getLogger(__name__)

__all__ = ["RunMps"]

_PIPE_MAX_CHARS = 80  # the pipe directory + "/control…" must stay under 108 bytes


class RunMps:
    """Start (if the run gets one) and always stop one run's MPS daemon."""

    def __init__(self, config: RunConfig, run_dir: RunDir) -> None:
        self.config = config
        self.run_dir = run_dir
        self.daemon: MpsDaemon | None = None
        self._tmp: Path | None = None

    def __repr__(self) -> str:
        return f"<RunMps({'active' if self.daemon is not None else 'inactive'})>"

    @staticmethod
    def wanted(config: RunConfig) -> tuple[bool, str]:
        """Whether a run with ``config`` gets an MPS daemon here, and why (or why not).

        Raises:
            RuntimeError: ``mps=True`` where MPS is not available.
        """
        if config.device != "cuda":
            return False, "device is cpu"
        if config.mps is False:
            return False, "mps=False"
        ok = MpsDaemon.available()
        if not ok:
            if config.mps:
                raise RuntimeError(f"mps=True but MPS cannot run here: {ok.reason}; use mps=None")
            return False, ok.reason
        return True, "mps=True" if config.mps else "MPS available (mps=None)"

    def start(self) -> dict[str, Any]:
        """Start the daemon if the run gets one; the ``mps`` entry of run.json.

        Raises:
            RuntimeError: ``mps=True`` and the daemon could not start (with ``mps=None`` the
                run goes on without MPS and the entry says why).
        """
        wanted, why = self.wanted(self.config)
        if not wanted:
            return {"active": False, "reason": why}
        pipe = self.run_dir.path / "mps" / "pipe"
        if len(str(pipe)) > _PIPE_MAX_CHARS:
            self._tmp = Path(tempfile.mkdtemp(prefix="freeride-mps-"))
            pipe = self._tmp
        daemon = MpsDaemon(pipe, self.run_dir.path / "mps" / "log")
        try:
            daemon.start()
        except RuntimeError as exc:
            self._remove_tmp()
            if self.config.mps:
                raise
            log.warning("running without MPS: %s", exc)
            return {"active": False, "reason": f"MPS daemon did not start: {exc}"}
        self.daemon = daemon
        return {
            "active": True,
            "reason": why,
            "pipe_dir": str(pipe),
            "log_dir": str(daemon.log_dir),
        }

    def client_env(self) -> dict[str, str]:
        """The variables that make a process its client ({} without a daemon)."""
        return self.daemon.client_env() if self.daemon is not None else {}

    def stop(self, *, leftovers: Callable[[], Sequence[psutil.Process]], grace_s: float) -> None:
        """Stop what is left of the run (``leftovers()``), then the daemon. Idempotent."""
        daemon, self.daemon = self.daemon, None
        if daemon is None:
            return
        left = list(leftovers())
        if left:
            log.warning("stopping %d leftover process(es) before the MPS daemon", len(left))
            stop_processes(left, grace_s)
        try:
            daemon.stop()
        except Exception:  # the run is over either way; say so and go on
            log.exception("could not stop the MPS daemon on %s", daemon.pipe_dir)
        self._remove_tmp()
        log.info("MPS daemon on %s stopped", daemon.pipe_dir)

    def _remove_tmp(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
