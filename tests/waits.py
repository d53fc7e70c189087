"""Waiting in tests, and finding a run's processes by walking the process table.

Importable from any test module (``tests/`` is on ``sys.path`` through its ``conftest.py``).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T | None], *, timeout_s: float, what: str, interval_s: float = 0.05
) -> T:
    """Poll ``predicate`` until it returns something true, and return that; TimeoutError
    naming ``what`` after ``timeout_s`` (a caller may catch it to add what it saw)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


def run_processes(run_dir: Path, *, environ: bool = False) -> list[psutil.Process]:
    """Live processes of a run, found in the process table, not through the run's bookkeeping:
    any whose command line names the run directory (or, with ``environ``, whose environment
    does: an MPS daemon knows the run only by its pipe directory), and the launcher's
    descendants."""
    needle = str(run_dir)
    me = psutil.Process().pid
    found: dict[int, psutil.Process] = {}
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == me:
            continue
        with contextlib.suppress(psutil.Error):
            if any(needle in a for a in p.info["cmdline"] or []) or (
                environ and any(needle in v for v in p.environ().values())
            ):
                found[p.pid] = p
    launcher_pid = None
    with contextlib.suppress(OSError, ValueError):
        launcher_pid = json.loads((run_dir / "run.json").read_text()).get("launcher_pid")
    if launcher_pid is not None:
        with contextlib.suppress(psutil.Error):
            for p in psutil.Process(launcher_pid).children(recursive=True):
                if p.status() != psutil.STATUS_ZOMBIE:
                    found[p.pid] = p
    return list(found.values())
