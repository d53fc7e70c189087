"""Preflight: the checks a run needs from this machine, made before anything is created.

``RunConfig`` validates itself (sizes, names, schedule feasibility); ``check_environment`` adds
what only the machine can say: is the rendezvous port free, can the bus bind, can the run
directory be written, is there CUDA. ``Session.launch`` calls it first, so a refusal leaves
nothing behind.

    check_environment(RunConfig(master_port=29500), Path("runs/x"))
    # ValueError: master_port=29500 is already in use on this host (Address already in use); ...
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
from pathlib import Path

from freeride_lab.core.config import RunConfig
from freeride_lab.io.rundir import check_private_dir

__all__ = ["MIN_FREE_BYTES", "check_environment"]

MIN_FREE_BYTES = 64 << 20  # a run directory needs at least this much free disk


def check_environment(config: RunConfig, run_dir: Path) -> None:
    """Checks that need this machine; raises before anything is created or started.

    Raises:
        ValueError: ``master_port`` in use, ``bus_host`` not bindable, ``run_dir`` already
            holding a run or not empty, or several nodes without an agreed ``master_port``.
        PermissionError: ``run_dir`` exists but is a symlink, another user's, or open to
            others (see [Note: a private run directory]).
        OSError: ``run_dir`` cannot be created or written, or its disk is (nearly) full.
        RuntimeError: ``device="cuda"`` without (enough) CUDA devices.
    """
    if config.nnodes > 1 and config.master_port is None:
        raise ValueError(
            f"nnodes={config.nnodes} needs an explicit master_port that every node uses; "
            "pass master_port=<port> (and the same master_addr) on each node"
        )
    if config.master_port is not None and config.node_rank == 0:
        _check_port_free(config.master_port)
    _check_bindable(config.bus_host)
    _check_run_dir(run_dir)
    if config.device == "cuda":
        _check_cuda(config.stages // config.nnodes)


def _bind_error(host: str, port: int, *, reuse: bool = False) -> OSError | None:
    """What binding a TCP socket to (``host``, ``port``) here meets; None when it binds.
    ``reuse`` sets SO_REUSEADDR (a port a closed run left in TIME_WAIT counts as free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e
    return None


def _check_port_free(port: int) -> None:
    e = _bind_error("", port, reuse=True)
    if e is not None:
        raise ValueError(
            f"master_port={port} is already in use on this host ({e.strerror}); "
            "pick another port or pass master_port=None to choose a free one"
        )


def _check_bindable(host: str) -> None:
    e = _bind_error(host, 0)
    if e is not None:
        raise ValueError(
            f"bus_host={host!r} cannot be bound on this host ({e.strerror or e}); "
            "use '127.0.0.1' or one of this host's addresses"
        )


def _check_run_dir(path: Path) -> None:
    if os.path.lexists(path):
        if (path / "run.json").exists():
            raise ValueError(
                f"run_dir={str(path)!r} already holds a run (it has run.json); pass a new "
                "directory, or run_dir=None for a fresh one under ./runs"
            )
        # see [Note: a private run directory]: another user's, a shared or a linked directory
        # would let others swap the run's secret
        check_private_dir(path, empty=True)
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise NotADirectoryError(
            errno.ENOTDIR,
            f"cannot create run directory {path}: {parent} is a file, not a directory; "
            "pass run_dir= a path under a writable directory",
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(
            errno.EACCES,
            f"cannot create run directory {path}: {parent} is not writable; "
            "pass run_dir= a path under a writable directory",
        )
    free = shutil.disk_usage(parent).free
    if free < MIN_FREE_BYTES:
        raise OSError(
            errno.ENOSPC,
            f"cannot create run directory {path}: only {free >> 20} MiB free at {parent}, it "
            f"needs at least {MIN_FREE_BYTES >> 20} MiB; free some space or pass run_dir= on "
            "another disk",
        )


def _check_cuda(needed: int) -> None:
    import torch  # only for device="cuda"

    if not torch.cuda.is_available():
        raise RuntimeError(
            f"device='cuda' but torch.cuda.is_available() is False (torch {torch.__version__}); "
            "use device='cpu', or install a CUDA build of torch on a machine with a GPU"
        )
    found = torch.cuda.device_count()
    if found < needed:
        raise RuntimeError(
            f"device='cuda' needs {needed} GPU(s) on this node (stages/nnodes, one per rank) "
            f"but {found} are visible; lower stages or raise nnodes"
        )
