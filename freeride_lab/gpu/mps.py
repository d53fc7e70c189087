"""``MpsDaemon``: a private CUDA MPS control daemon for one run.

    >>> MpsDaemon.available()            # on a machine without a GPU
    Availability(ok=False, reason='no NVIDIA GPU device (/dev/nvidia0) on this machine')

    with MpsDaemon(run_dir / "mps" / "pipe", run_dir / "mps" / "log") as mps:
        env = {**os.environ, **mps.client_env(), **env_for(limits, mps_active=True, device_index=0)}

The daemon uses private ``CUDA_MPS_PIPE_DIRECTORY``/``CUDA_MPS_LOG_DIRECTORY`` directories, so it
never touches another user's or another run's MPS. Every CUDA process that sees the same pipe
directory becomes its client, *training ranks included*: start it before any rank initialises
CUDA and stop it after every process has exited (pipelining-and-gpu.md §8). Side tasks get
their limits as client environment variables (``limits.env_for``); the ranks get none (priority
0, no cap), as in FreeRide.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = ["Availability", "MpsDaemon"]

_CONTROL = "nvidia-cuda-mps-control"


@dataclass(frozen=True)
class Availability:
    """Whether something can be used here, and why not. Truthy when usable."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


class MpsDaemon:
    """Start, query and stop one MPS control daemon with private pipe and log directories.

    ``stop()`` is idempotent; the context manager starts and stops it.
    """

    def __init__(self, pipe_dir: str | os.PathLike[str], log_dir: str | os.PathLike[str]) -> None:
        self.pipe_dir = Path(pipe_dir)
        self.log_dir = Path(log_dir)
        self._started = False

    @staticmethod
    def available() -> Availability:
        """Usable here: the control binary is on PATH and an NVIDIA GPU device exists."""
        if not glob.glob("/dev/nvidia[0-9]*"):
            return Availability(False, "no NVIDIA GPU device (/dev/nvidia0) on this machine")
        if shutil.which(_CONTROL) is None:
            return Availability(
                False, f"{_CONTROL} is not on PATH; install the CUDA toolkit's MPS binaries"
            )
        return Availability(True)

    def client_env(self) -> dict[str, str]:
        """The variables that make a process a client of this daemon (or control it)."""
        return {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
        }

    def start(self, *, timeout_s: float = 10.0) -> None:
        """Start the daemon (``nvidia-cuda-mps-control -d``) and wait until it answers.

        Raises:
            RuntimeError: MPS is not available here, or the daemon did not come up in time
                (the message quotes the end of its control log).
        """
        if self._started and self.is_running():
            return
        ok = self.available()
        if not ok:
            raise RuntimeError(f"cannot start MPS: {ok.reason}")
        for d in (self.pipe_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.is_running():
            raise RuntimeError(
                f"an MPS daemon already serves pipe directory {str(self.pipe_dir)!r}; "
                "stop it first or use another directory"
            )
        env = {**os.environ, **self.client_env()}
        result = subprocess.run(
            [_CONTROL, "-d"],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{_CONTROL} -d exited with {result.returncode}: {result.stderr.strip()!r}"
            )
        deadline = time.monotonic() + timeout_s
        while not self.is_running():
            if time.monotonic() >= deadline:
                tail = self._log_tail()
                raise RuntimeError(
                    f"MPS daemon did not answer within {timeout_s} s; control log: {tail!r}"
                )
            time.sleep(0.05)
        self._started = True
        log.info("MPS daemon up, pipe directory %s", self.pipe_dir)

    def is_running(self) -> bool:
        """True if a daemon answers on this pipe directory."""
        if not (self.pipe_dir / "control").exists():
            return False
        return self._command("get_server_list", timeout_s=5.0) is not None

    def stop(self, *, grace_s: float = 10.0) -> None:
        """Ask the daemon to quit (``echo quit | nvidia-cuda-mps-control``) and wait. Idempotent."""
        if not self.is_running():
            self._started = False
            return
        self._command("quit", timeout_s=grace_s)
        deadline = time.monotonic() + grace_s
        while self.is_running():
            if time.monotonic() >= deadline:
                log.warning(
                    "MPS daemon on %s still answers %.0f s after quit", self.pipe_dir, grace_s
                )
                break
            time.sleep(0.05)
        self._started = False

    def _command(self, command: str, *, timeout_s: float) -> str | None:
        """Send one control command; its output, or None if the daemon did not answer."""
        if shutil.which(_CONTROL) is None:
            return None
        try:
            result = subprocess.run(
                [_CONTROL],
                input=command + "\n",
                env={**os.environ, **self.client_env()},
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return None
        return result.stdout if result.returncode == 0 else None

    def _log_tail(self) -> str:
        try:
            return (self.log_dir / "control.log").read_text()[-500:]
        except OSError:
            return ""

    def __enter__(self) -> MpsDaemon:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "started" if self._started else "stopped"
        return f"<MpsDaemon(pipe_dir={str(self.pipe_dir)!r}, {state})>"
