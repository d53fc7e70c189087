"""A side task's checkpoint: its file format and when the host writes and restores it.

# [Note: checkpoint format]
``<run_dir>/tasks/<task_id>/checkpoint.pt``, replaced atomically. It is a ``torch.save`` file
when the task process has imported torch (then it may hold tensors) and JSON otherwise, so a
task without torch never pays for importing it; loading tells them apart by the zip magic.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from freeride_lab.core.sidetask_state import SideTaskState
from freeride_lab.io.rundir import create_file
from freeride_lab.sidetasks.host.base import HostBase, log
from freeride_lab.sidetasks.spec import checkpoint_path

__all__ = ["Checkpointing", "load_checkpoint", "save_checkpoint"]

#: A periodic checkpoint at least this long is logged: the host takes no bubble while it saves.
_LONG_CHECKPOINT_S = 0.05


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` atomically (see [Note: checkpoint format])."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    torch = sys.modules.get("torch")
    try:
        with os.fdopen(create_file(tmp), "wb") as f:
            if torch is not None:
                torch.save(state, f)
            else:
                f.write(json.dumps(state).encode())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_checkpoint(path: Path) -> dict[str, Any] | None:
    """The saved state, or None if there is no checkpoint."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except FileNotFoundError:
        return None
    if head == b"PK":
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True)
    else:
        state = json.loads(path.read_text())
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {str(path)!r} holds a {type(state).__name__}, not a dict")
    return state


class Checkpointing(HostBase):
    """The host's checkpoints: restored at CREATE, written on demand, at a stop or a preemption,
    and every ``checkpoint_interval_s`` while the task is parked."""

    def _restore(self) -> str:
        task = self.task
        assert task is not None
        self._where = "restoring the checkpoint"
        path = checkpoint_path(self.spec.run_dir, self.spec.task.task_id)
        state = load_checkpoint(path)
        if state is None:
            return "no checkpoint"
        task.load_state_dict(state)
        self._saved_progress = task.progress
        return f"restored progress {task.progress:g} {task.unit} from checkpoint"

    def _checkpoint(self) -> None:
        task = self.task
        if task is None:
            return
        self._where = "state_dict"
        save_checkpoint(
            checkpoint_path(self.spec.run_dir, self.spec.task.task_id), task.state_dict()
        )
        self._saved_progress = task.progress
        self._last_checkpoint_s = time.monotonic()

    def _maybe_checkpoint(self) -> None:
        task = self.task
        if task is None or self.machine.state not in (SideTaskState.PAUSED, SideTaskState.CREATED):
            return
        if time.monotonic() - self._last_checkpoint_s < self.spec.task.checkpoint_interval_s:
            return
        if task.progress == self._saved_progress:
            self._last_checkpoint_s = time.monotonic()
            return
        driver = self._driver
        if driver is not None and driver.started and not driver.parked:
            return  # run() is between pause points; wait for a clean boundary
        start_s = time.monotonic()
        self._checkpoint()
        took_s = time.monotonic() - start_s
        if took_s >= _LONG_CHECKPOINT_S:  # no bubble was taken, nor any handed on, meanwhile
            log.info("task %s: periodic checkpoint took %.2f s; its bubbles in that time went "
                     "unused", self.spec.task.task_id, took_s)  # fmt: skip
