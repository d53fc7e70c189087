"""The devices a benchmark run uses: its own MPS daemon and an NVML sampler.

The benchmark owns the MPS daemon of a run with ``mps=True``: private pipe and log
directories, put in the environment of everything the run starts, and stopped after the run.
Nothing here initialises CUDA (MPS must start before any CUDA process).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["nvml_sampler", "private_mps_daemon"]


@contextlib.contextmanager
def private_mps_daemon(say: Callable[[str], None]) -> Iterator[None]:
    """An MPS daemon of our own while the block runs, its client environment in ``os.environ``
    (inherited by every process started inside); the environment is restored after."""
    from freeride_lab.gpu.mps import MpsDaemon

    root = Path(tempfile.mkdtemp(prefix="frl-mps-"))  # short: a socket path lives here
    daemon = MpsDaemon(root / "pipe", root / "log")
    daemon.start()
    saved = {k: os.environ.get(k) for k in daemon.client_env()}
    os.environ.update(daemon.client_env())
    say(f"MPS daemon up (pipe {daemon.pipe_dir})")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        daemon.stop()


@contextlib.contextmanager
def nvml_sampler() -> Iterator[Any]:
    """A running ``gpu.nvml.NvmlSampler`` (0.1 s), stopped after the block."""
    from freeride_lab.gpu.nvml import NvmlSampler

    sampler = NvmlSampler(interval_s=0.1, capacity=100_000)
    sampler.start()
    try:
        yield sampler
    finally:
        sampler.stop()
