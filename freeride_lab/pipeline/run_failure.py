"""Why a run failed: which rank, and its one-line reason, from the event files and torchrun's
log (``failure_reason``; the launcher writes it to status.json).
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from freeride_lab.io.rundir import RunDir
from freeride_lab.pipeline.rendezvous import Rendezvous

__all__ = ["failure_reason"]

_EXIT_RE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*exitcode\s*:\s*(-?\d+)")


def failure_reason(run_dir: RunDir, exit_code: int | None) -> tuple[int | None, str]:
    """Which rank failed and why; returns ``(rank or None, one-line reason)``.

    [Note: finding the failing rank]
    When one rank dies, its peers soon fail too (a collective loses its partner) and write
    RankFailed events of their own, so the earliest event is not always the cause. A rank that
    torchrun saw exit non-zero *without* a RankFailed event died silently (a signal, a crash,
    the OOM killer): that is the cause, and comes first. Otherwise the earliest RankFailed
    (by its ``t_ns``) is. torchrun's exit report lists the root cause first.
    """
    events = _rank_failed_events(run_dir)
    log_path = run_dir.logs_dir / "torchrun.log"
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        text = ""
    root = text.find("Root Cause")
    exits = [(int(r), int(c)) for r, c in _EXIT_RE.findall(text[root:] if root >= 0 else "")]
    exits += [(int(r), int(c)) for r, c in _EXIT_RE.findall(text[:root] if root >= 0 else text)]
    for rank, code in exits:
        if rank not in events and code < 0:
            return rank, f"rank {rank} was killed by {_signal_name(-code)}"
        if rank not in events and code > 0:  # e.g. an error before its event file was open
            last = _last_line(_rank_stderr(run_dir, rank))
            return rank, f"rank {rank} exited with code {code}" + (f": {last}" if last else "")
    if events:
        first = min(events.values(), key=lambda e: int(e.get("t_ns", 0)))
        rank = int(first.get("rank", -1))
        return rank, f"rank {rank} failed: {first.get('error', '?')}"
    last = _last_line([log_path])
    return None, f"torchrun exited with code {exit_code}" + (f": {last}" if last else "")


def _rank_failed_events(run_dir: RunDir) -> dict[int, dict[str, Any]]:
    """Each rank's earliest RankFailed event, read from the event files."""
    found: dict[int, dict[str, Any]] = {}
    for path in run_dir.event_files():
        try:
            with open(path, "rb") as f:
                for line in f:
                    if b'"rank_failed"' not in line:
                        continue
                    with contextlib.suppress(ValueError, TypeError, KeyError):
                        e = json.loads(line)
                        rank = int(e["rank"])
                        if rank not in found or e.get("t_ns", 0) < found[rank].get("t_ns", 0):
                            found[rank] = e
        except OSError:
            continue
    return found


def _rank_stderr(run_dir: RunDir, rank: int) -> list[Path]:
    try:
        rdzv = Rendezvous.from_config(run_dir.read_run()["config"])
        local = rank - rdzv.node_rank * rdzv.nproc_per_node
    except (OSError, ValueError, KeyError, TypeError):
        local = rank
    return sorted(run_dir.logs_dir.glob(f"**/attempt_*/{local}/stderr.log"))


def _last_line(paths: Sequence[Path]) -> str:
    for path in reversed(paths):
        try:
            lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()]
        except OSError:
            continue
        lines = [ln for ln in lines if ln]
        if lines:
            return lines[-1][:300]
    return ""


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
