"""A side task's checkpoint: its file format and when the host writes and restores it.

# [Note: checkpoint format]
``<run_dir>/tasks/<task_id>/checkpoint.pt``, replaced atomically. It is a ``torch.save`` file
when the task process has imported torch (then it may hold tensors) and JSON otherwise, so a
task without torch never pays for importing it; loading tells them apart by the zip magic.

# [Note: periodic checkpoints in the background]
While the host saves, it reads no edge: it takes no bubble and hands none on to the stage's
leftovers task. Serialising a large model and writing it out takes most of a second (VGG-19's
weights and Adam state are 1.7 GB), so a periodic checkpoint is split: the host takes the state
(``state_dict()``, the task's own copies to host memory; for a task that does not declare
``state_dict_is_copy``, its tensors are copied here, since the next step would change them in
place under the writer), its GPU copies left in flight (``sidetasks.host_copy`` [Note: copies
left in flight]), then a writer thread waits for them and saves it (``torch.save`` lets go of
the GIL while it writes a tensor's bytes). One write at a time: a periodic checkpoint due while
one is still being written waits for the next turn. Every other checkpoint (a stop, a
preemption, on demand) is written on the host's thread, after any write in flight, so the newest
state is the one on disk. A write that failed fails the task at the host's next look, as a
checkpoint written on its own thread would.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from freeride_lab.core import events as ev
from freeride_lab.core.sidetask_state import SideTaskState
from freeride_lab.io.rundir import create_file
from freeride_lab.sidetasks.host.base import HostBase, log
from freeride_lab.sidetasks.host_copy import CopiesInFlight, copies_in_flight, host_copies
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

    def _checkpoint(self, why: str) -> None:
        """Save the task's state now, on this thread (after a periodic write in flight);
        ``why`` goes into its ``SideTaskCheckpoint`` event."""
        task = self.task
        if task is None:
            return
        start_ns = self._now_ns()
        self._drain_writer()  # the state saved now is newer than a periodic one in flight
        self._where = "state_dict"
        save_checkpoint(
            checkpoint_path(self.spec.run_dir, self.spec.task.task_id), task.state_dict()
        )
        self._saved_progress = task.progress
        self._last_checkpoint_s = time.monotonic()
        self._emit_checkpoint(start_ns, why)

    def _emit_checkpoint(self, start_ns: int, why: str) -> None:
        """The ``SideTaskCheckpoint`` event of a checkpoint whose hold began at ``start_ns``
        and ends now."""
        self.sink.emit(
            ev.SideTaskCheckpoint(
                task_id=self.spec.task.task_id,
                name=self.spec.task.display_name,
                stage=self.spec.stage,
                rank=self.spec.rank,
                start_ns=start_ns,
                end_ns=self._now_ns(),
                why=why,
            )
        )

    def _checkpoint_in_background(self) -> None:
        """Take the task's state here and write it from a writer thread ([Note: periodic
        checkpoints in the background])."""
        task = self.task
        assert task is not None
        start_ns = self._now_ns()
        self._where = "state_dict"
        with copies_in_flight() as copies:
            state = task.state_dict()
            if not getattr(task, "state_dict_is_copy", False):
                state = host_copies(state)
        self._copies = copies if copies else None  # waited for before the task's next change
        self._saved_progress = task.progress
        self._last_checkpoint_s = time.monotonic()
        path = checkpoint_path(self.spec.run_dir, self.spec.task.task_id)
        writer = threading.Thread(
            target=self._write, args=(path, state, copies), name="task-checkpoint", daemon=True
        )
        self._writer = writer
        writer.start()
        self._emit_checkpoint(start_ns, "periodic")

    def _write(self, path: Path, state: dict[str, Any], copies: CopiesInFlight) -> None:
        """The writer thread: wait for ``state``'s copies, save it; an error is kept for the
        host's next look."""
        try:
            copies.wait()
            save_checkpoint(path, state)
        except BaseException as exc:  # a full disk, an unpicklable state: the host fails it
            self._write_error = exc

    def _drain_writer(self) -> None:
        """Wait for a periodic write in flight (its file then whole or not there), logging
        what made it fail: at the host's end, and before a checkpoint that replaces it."""
        try:
            self._finish_writing()
        except BaseException as exc:
            log.warning("task %s: a periodic checkpoint was not written: %r",
                        self.spec.task.task_id, exc)  # fmt: skip

    def _finish_writing(self) -> None:
        """Wait for a periodic write in flight; raise what made it fail, if anything did."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.join()
        error, self._write_error = self._write_error, None
        if error is not None:
            self._where = "writing a periodic checkpoint"
            raise error

    def _maybe_checkpoint(self) -> None:
        task = self.task
        writer = self._writer
        if writer is not None and not writer.is_alive():
            self._finish_writing()  # done: raise what made it fail, if anything did
        elif writer is not None:
            return  # still writing the last one
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
        self._checkpoint_in_background()
        took_s = time.monotonic() - start_s
        if took_s >= _LONG_CHECKPOINT_S:  # no bubble was taken, nor any handed on, meanwhile
            task_id = self.spec.task.task_id
            log.info("task %s: taking the state for a periodic checkpoint took %.2f s; its "
                     "bubbles in that time went unused", task_id, took_s)  # fmt: skip
