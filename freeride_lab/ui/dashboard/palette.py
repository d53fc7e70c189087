"""The board's palette: the built-in side tasks and the user tasks of ``%%freeride_task``.

[Note: user side tasks]
``%%freeride_task NAME`` (``freeride_lab.magics``) writes a cell to ``<tasks_dir>/NAME.py`` and
describes it in ``<tasks_dir>/NAME.json`` (:class:`UserTask`). The board's palette is the built-in
tasks plus every ``*.json`` there (re-read when the directory changes), and the board's
controller resolves a palette name to the task reference ``"…/NAME.py:Class"``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from freeride_lab.core.accounting import FREERIDE_UNITS
from freeride_lab.tasks import registry
from freeride_lab.ui.names import task_label

log = logging.getLogger(__name__)

__all__ = ["TASKS_DIR", "UserTask", "builtin_palette", "dir_token", "user_tasks"]

TASKS_DIR = Path(".freeride_tasks")  # relative to the kernel's working directory


@dataclass(frozen=True, kw_only=True)
class UserTask:
    """A side task written by ``%%freeride_task``: its palette name and where its class lives."""

    name: str  # what users type: ``%freeride attach NAME``
    ref: str  # "/abs/path/NAME.py:Class", for Session.attach
    unit: str = "iterations"
    title: str = ""

    def palette_entry(self) -> dict[str, str]:
        return {"name": self.name, "title": self.title or self.name, "unit": self.unit}

    def save(self, directory: Path) -> Path:
        """Write ``<directory>/<name>.json``; returns its path."""
        path = directory / f"{self.name}.json"
        path.write_text(json.dumps(asdict(self), indent=1), encoding="utf-8")
        return path


def user_tasks(directory: Path | None = None) -> dict[str, UserTask]:
    """The user tasks registered in ``directory`` (default ``./.freeride_tasks``), by name.

    Entries whose ``.py`` file is gone, or whose JSON does not parse, are left out.
    """
    directory = TASKS_DIR if directory is None else directory
    found: dict[str, UserTask] = {}
    if not directory.is_dir():
        return found
    for path in sorted(directory.glob("*.json")):
        try:
            task = UserTask(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            log.warning("skipping unreadable user task description %s", path)
            continue
        if Path(task.ref.rpartition(":")[0]).is_file():
            found[task.name] = task
    return found


def builtin_palette() -> list[dict[str, str]]:
    """``{name, title, unit}`` of each task in ``freeride_lab.tasks.registry``: the built-ins,
    then the registered ones (their unit is known once they load, so it is left blank)."""
    return [
        {
            "name": name,
            "title": task_label(name),
            "unit": FREERIDE_UNITS.get(registry.reference_key(name), "")
            if name in registry.BUILTIN_TASKS
            else "",
        }
        for name in registry.names()
    ]


def dir_token(directory: Path) -> float | None:
    """The directory's modification time (None if it is missing): changes when a task is added."""
    try:
        return directory.stat().st_mtime
    except OSError:
        return None
