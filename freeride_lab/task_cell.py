"""A ``%%freeride_task NAME`` cell made into a side task that runs can attach by NAME.

Spawned side-task processes cannot unpickle classes defined in a notebook, so the cell is
written to ``<tasks_dir>/NAME.py``, imported once on its own, checked to define exactly one
``IterativeSideTask``/``ImperativeSideTask`` subclass, loaded the way a side-task process will
load it, and registered as NAME (see [Note: user side tasks] in ``freeride_lab.ui.dashboard``).
Nothing here imports IPython; every refusal is one ``ValueError`` line that the magic shows.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from freeride_lab.sidetasks.api import SideTaskBase

__all__ = ["save_task_cell"]

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")


def save_task_cell(line: str, cell: str, tasks_dir: Path) -> tuple[str, type[SideTaskBase], Path]:
    """Write, check and register the cell ``cell`` under the name on ``line``; returns
    (NAME, its class, the file written).

    Raises:
        ValueError: a bad or built-in NAME, a syntax error, a cell that raises anything while
            it runs (``sys.exit()``, ``KeyboardInterrupt`` and endless recursion included), or
            not exactly one side-task class; the message says which, in one line.
    """
    from freeride_lab.tasks import registry
    from freeride_lab.ui.dashboard import UserTask

    name = line.strip()
    if not _NAME_RE.match(name):
        raise ValueError(
            f"%%freeride_task needs one NAME (letters, digits, _ or -), got {line.strip()!r}"
        )
    if name.lower().replace("-", "_") in registry.BUILTIN_TASKS:
        raise ValueError(
            f"{name!r} is a built-in side task; pick another NAME "
            f"(built-in: {', '.join(registry.BUILTIN_TASKS)})"
        )
    try:
        compile(cell, f"<%%freeride_task {name}>", "exec")
    except SyntaxError as exc:
        raise ValueError(f"{name}: line {exc.lineno}: {exc.msg}") from None
    tasks_dir.mkdir(parents=True, exist_ok=True)
    path = (tasks_dir / f"{name}.py").absolute()
    path.write_text(
        f"# written by %%freeride_task {name}; edit the notebook cell, not this file\n{cell}",
        encoding="utf-8",
    )
    _forget_module(path)
    cls = _the_task_class(name, path)
    ref = f"{path}:{cls.__name__}"
    try:
        registry.load(ref)  # what the side-task process will do
    except ValueError:
        raise
    except BaseException as exc:  # see _the_task_class
        raise ValueError(_cell_failure(name, exc)) from None
    registry.register(name, ref)
    UserTask(name=name, ref=ref, unit=str(cls.unit), title=name).save(tasks_dir)
    return name, cls, path


def _forget_module(path: Path) -> None:
    """Drop modules loaded from ``path`` so a re-run cell is imported afresh."""
    for key, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file is not None and Path(file).absolute() == path:
            del sys.modules[key]


def _cell_failure(name: str, exc: BaseException) -> str:
    """One line on why running a ``%%freeride_task`` cell failed."""
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return f"{name}: running the cell failed: {detail}; the task was not registered"


def _the_task_class(name: str, path: Path) -> type[SideTaskBase]:
    """Import ``path`` once, on its own, and return its one side-task class."""
    from freeride_lab.sidetasks.api import ImperativeSideTask, IterativeSideTask

    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    module_name = f"freeride_cell_{name.replace('-', '_')}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{name}: {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # sys.exit(), KeyboardInterrupt, RecursionError: the kernel lives
        raise ValueError(_cell_failure(name, exc)) from None
    bases = (IterativeSideTask, ImperativeSideTask)
    found = [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, bases)
        and value not in bases
        and value.__module__ == module_name
    ]
    if len(found) != 1:
        names = ", ".join(c.__name__ for c in found) or "none"
        raise ValueError(
            f"{name}: the cell must define exactly one IterativeSideTask or ImperativeSideTask "
            f"subclass (from freeride_lab import IterativeSideTask); it defines {names}"
        )
    return found[0]
