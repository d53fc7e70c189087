"""Where a node's ranks meet (``Rendezvous``) and the torchrun command line that starts them.

Read from run.json without importing torch; only ``torchrun_command`` asks the installed
torchrun which options it knows (they vary across torch releases).
"""

from __future__ import annotations

import math
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from freeride_lab.core.torch_compat import torchrun_option_strings
from freeride_lab.io.rundir import RunDir

__all__ = [
    "DEFAULT_RANK_ENTRY",
    "TORCHRUN_SIGNALS",
    "Rendezvous",
    "free_port",
    "torchrun_command",
]

DEFAULT_RANK_ENTRY: tuple[str, ...] = ("-m", "freeride_lab.pipeline.rank")
TORCHRUN_SIGNALS = "SIGTERM,SIGHUP,SIGQUIT"  # not SIGINT: [Note: SIGINT and torchrun] in launcher


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (bind port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, kw_only=True)
class Rendezvous:
    """Where this node's ranks meet the others (from a validated ``RunConfig``)."""

    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int | None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Rendezvous:
        """From ``RunConfig.to_dict()`` as stored in run.json (read without importing torch)."""
        return cls(
            nnodes=int(config["nnodes"]),
            node_rank=int(config["node_rank"]),
            nproc_per_node=int(config["stages"]) // int(config["nnodes"]),
            master_addr=str(config["master_addr"]),
            master_port=None if config["master_port"] is None else int(config["master_port"]),
        )


def torchrun_command(
    rdzv: Rendezvous,
    run_dir: RunDir,
    *,
    entry: Sequence[str] = DEFAULT_RANK_ENTRY,
    grace_s: float = 10.0,
) -> list[str]:
    """The torchrun command line for this node's ranks (``rdzv.master_port`` must be set)."""
    if rdzv.master_port is None:
        raise ValueError("master_port is None; resolve it (e.g. free_port()) first")
    return [
        sys.executable, "-m", "freeride_lab.pipeline.torchrun",  # torchrun, fast exit
        "--nnodes", str(rdzv.nnodes),
        "--node-rank", str(rdzv.node_rank),
        "--nproc-per-node", str(rdzv.nproc_per_node),
        "--master-addr", rdzv.master_addr,
        "--master-port", str(rdzv.master_port),
        "--max-restarts", "0",
        "--log-dir", str(run_dir.logs_dir),
        "--tee", "3",
        *_optional_torchrun_flags(grace_s),
        *entry,
        "--run-dir", str(run_dir.path),
    ]  # fmt: skip


def _optional_torchrun_flags(grace_s: float) -> list[str]:
    # --signals-to-handle and --shutdown-timeout are newer than torch 2.8; older torchruns
    # refuse unknown flags, and our ranks ignore SIGINT either way.
    known = torchrun_option_strings()
    flags: list[str] = []
    if "--signals-to-handle" in known:
        flags += ["--signals-to-handle", TORCHRUN_SIGNALS]
    if "--shutdown-timeout" in known:
        flags += ["--shutdown-timeout", str(max(1, math.ceil(grace_s)))]
    return flags
