"""Find a side-task class from a reference: an import path or a file path.

    >>> parse_task_ref("my_tasks.counting:Counter")
    'my_tasks.counting:Counter'

    cls = load_task_class("my_pkg.tasks:MyTask")             # importable module
    cls = load_task_class("notebooks/tasks/mine.py:MyTask")  # a file (e.g. written by a cell magic)

Names ("resnet18", a task a notebook registered) are not known on this floor: they resolve into
references in ``freeride_lab.tasks.registry``, above it. Task processes are started by spawn,
which cannot unpickle a class defined in a notebook cell, so user code always travels as one of
these strings.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from freeride_lab.sidetasks.api import ImperativeSideTask, IterativeSideTask, SideTaskBase

__all__ = ["check_task_ref", "load_task_class", "parse_task_ref"]

_FORMS = "an import path 'pkg.module:Class' or a file path 'path/to/file.py:Class'"


def parse_task_ref(ref: str) -> str:
    """``ref`` stripped, once it is of the form "module:Class" or "file.py:Class".

    Raises:
        ValueError: ``ref`` is neither form (a task name is one: resolve it with
            ``freeride_lab.tasks.registry.resolve`` first).
    """
    if not isinstance(ref, str) or not ref.strip():
        raise ValueError(f"task {ref!r} is empty; give {_FORMS}")
    ref = ref.strip()
    where, sep, cls_name = ref.rpartition(":")
    if not sep or not where or not cls_name.isidentifier():
        raise ValueError(
            f"task {ref!r} is not a 'where:Class' reference; give {_FORMS} (a task name "
            "such as 'resnet18' resolves through freeride_lab.tasks.registry.resolve)"
        )
    return ref


def check_task_ref(ref: str) -> str:
    """Cheap check that ``ref`` can be found (file exists / module findable), without importing.

    Returns the resolved reference. For a full check (the class exists and is a side task) use
    ``load_task_class``.

    Raises:
        ValueError: unknown form, missing file or unfindable module.
    """
    resolved = parse_task_ref(ref)
    where, _, _ = resolved.rpartition(":")
    if where.endswith(".py"):
        if not Path(where).expanduser().is_file():
            raise ValueError(
                f"task {ref!r}: file {where!r} does not exist; give an existing .py file"
            )
        return resolved
    try:
        found = importlib.util.find_spec(where)
    except (ImportError, ValueError) as exc:
        raise ValueError(f"task {ref!r}: module {where!r} cannot be found ({exc})") from exc
    if found is None:
        raise ValueError(
            f"task {ref!r}: module {where!r} cannot be found on sys.path; install it, or give "
            "a file path 'path/to/file.py:Class'"
        )
    return resolved


def load_task_class(ref: str) -> type[SideTaskBase]:
    """Import and return the side-task class that ``ref`` names.

    Raises:
        ValueError: unknown form, missing file or module, an import error inside the module,
            no such class, or a class that is not an ``IterativeSideTask``/``ImperativeSideTask``.
    """
    resolved = parse_task_ref(ref)
    where, _, cls_name = resolved.rpartition(":")
    module = _load_file(ref, where) if where.endswith(".py") else _load_module(ref, where)
    cls = getattr(module, cls_name, None)
    if cls is None:
        public = sorted(
            n
            for n, v in vars(module).items()
            if isinstance(v, type) and issubclass(v, SideTaskBase)
        )
        hint = (
            f"side-task classes there: {', '.join(public)}"
            if public
            else "it defines no side-task class"
        )
        raise ValueError(f"task {ref!r}: {where!r} has no class {cls_name!r}; {hint}")
    if not (
        isinstance(cls, type)
        and issubclass(cls, IterativeSideTask | ImperativeSideTask)
        and cls not in (IterativeSideTask, ImperativeSideTask)
    ):
        raise ValueError(
            f"task {ref!r}: {cls_name} is not a subclass of IterativeSideTask or "
            "ImperativeSideTask (freeride_lab.sidetasks.api); derive it from one of them"
        )
    return cls


def _load_module(ref: str, name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and name.startswith(exc.name):
            raise ValueError(
                f"task {ref!r}: module {name!r} cannot be found on sys.path; install it, or give "
                "a file path 'path/to/file.py:Class'"
            ) from exc
        raise ValueError(f"task {ref!r}: importing {name!r} failed: {exc}") from exc
    except (Exception, SystemExit) as exc:  # a module that calls sys.exit() is refused too
        raise ValueError(
            f"task {ref!r}: importing {name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc


def _load_file(ref: str, where: str) -> ModuleType:
    path = Path(where).expanduser().resolve()
    if not path.is_file():
        raise ValueError(f"task {ref!r}: file {where!r} does not exist; give an existing .py file")
    # One module per file path, so two files named tasks.py do not collide.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"freeride_user_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"task {ref!r}: {where!r} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # a file that calls sys.exit() is refused too
        del sys.modules[name]
        raise ValueError(
            f"task {ref!r}: running {where!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    return module
