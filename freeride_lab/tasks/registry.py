"""The one map from side-task names to task classes: the built-ins, and the tasks a notebook
registers.

Everything that takes a task by name (``Session.attach``, ``freeride-lab attach``, ``%freeride
attach``, the dashboard's palette) resolves it here into a reference that a side-task process
can import: ``"module:Class"`` or ``"path/to/file.py:Class"``. Below this floor
(``freeride_lab.sidetasks.loader``) only such references exist, never names::

    >>> resolve("ResNet18")
    'freeride_lab.tasks.vision:ResNet18Task'
    >>> resolve("my_pkg.tasks:MyTask")            # a reference passes unchanged
    'my_pkg.tasks:MyTask'
    >>> register("ranks", "freeride_lab.tasks.graph:PageRankTask")
    'freeride_lab.tasks.graph:PageRankTask'
    >>> resolve("RANKS")
    'freeride_lab.tasks.graph:PageRankTask'
    >>> unregister("ranks")

Names match without regard to case, and ``-`` equals ``_``. Registrations live in this process
(a notebook kernel, a CLI command); task processes receive the resolved reference.
Importing this module does not import torch.
"""

from __future__ import annotations

import difflib
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from freeride_lab.sidetasks.api import SideTaskBase

__all__ = [
    "BUILTIN_TASKS",
    "REFERENCE_KEYS",
    "check",
    "is_known",
    "load",
    "names",
    "reference_key",
    "register",
    "registered",
    "resolve",
    "unregister",
]

#: Built-in task name → ``"module:Class"`` reference: FreeRide's six tasks (paper §12), then
#: batch inference, which FreeRide did not run (so it has no reference throughput).
BUILTIN_TASKS: Mapping[str, str] = MappingProxyType(
    {
        "resnet18": "freeride_lab.tasks.vision:ResNet18Task",
        "resnet50": "freeride_lab.tasks.vision:ResNet50Task",
        "vgg19": "freeride_lab.tasks.vision:VGG19Task",
        "pagerank": "freeride_lab.tasks.graph:PageRankTask",
        "sgd_mf": "freeride_lab.tasks.graph:SGDMFTask",
        "image": "freeride_lab.tasks.image:ImageTask",
        "inference": "freeride_lab.tasks.inference:InferenceTask",
    }
)

#: Built-in task name → key of its FreeRide reference throughput θ (RTX 3080, paper §13),
#: for cost accounting. Each class also carries its key as ``reference_key``.
REFERENCE_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "resnet18": "resnet18",
        "resnet50": "resnet50",
        "vgg19": "vgg19",
        "pagerank": "pagerank",
        "sgd_mf": "sgd",
        "image": "image",
    }
)

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
_lock = threading.Lock()
_registered: dict[str, tuple[str, str]] = {}  # key → (name as registered, reference)


def _key(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def names() -> list[str]:
    """Every name ``resolve`` knows: the built-ins first, then registered tasks in order."""
    with _lock:
        return [*BUILTIN_TASKS, *(name for name, _ in _registered.values())]


def registered() -> dict[str, str]:
    """The registered (not built-in) tasks: name → reference."""
    with _lock:
        return dict(_registered.values())


def is_known(name: str) -> bool:
    """Whether ``name`` is a built-in or registered task name (not a reference)."""
    if not isinstance(name, str):
        return False
    key = _key(name)
    with _lock:
        return key in BUILTIN_TASKS or key in _registered


def register(name: str, ref: str) -> str:
    """Make ``name`` resolve to ``ref`` (``"module:Class"`` or ``"path/file.py:Class"``) in
    this process; registering a name again replaces it. A file path is stored absolute, since
    task processes may start elsewhere. Nothing is imported: ``load`` imports.

    Returns the stored reference.

    Raises:
        ValueError: a malformed name, a built-in name, or a reference that is malformed, names
            a missing file or an unfindable module.
    """
    from freeride_lab.sidetasks.loader import check_task_ref

    if not isinstance(name, str) or not _NAME.match(name.strip()):
        raise ValueError(
            f"task name {name!r} must be 1-64 letters, digits, '_' or '-', starting with a letter"
        )
    key = _key(name)
    if key in BUILTIN_TASKS:
        raise ValueError(
            f"{name!r} is a built-in side task; pick another name "
            f"(built-in: {', '.join(BUILTIN_TASKS)})"
        )
    resolved = check_task_ref(ref)
    where, _, cls_name = resolved.rpartition(":")
    if where.endswith(".py"):
        resolved = f"{Path(where).expanduser().resolve()}:{cls_name}"
    with _lock:
        _registered[key] = (name.strip(), resolved)
    return resolved


def unregister(name: str) -> None:
    """Forget a registered name (a name that is not registered is ignored)."""
    with _lock:
        _registered.pop(_key(name), None)


def resolve(name_or_ref: str) -> str:
    """The reference a side-task process imports for a name or a reference.

    A ``"where:Class"`` reference is returned unchanged (stripped); a name is looked up among
    the built-ins, then the registered tasks.

    Raises:
        ValueError: empty, or an unknown name (the message lists the names and a near miss).
    """
    if not isinstance(name_or_ref, str) or not name_or_ref.strip():
        raise ValueError(
            f"task {name_or_ref!r} is empty; give a task name ({', '.join(names())}), "
            "'pkg.module:Class' or 'path/to/file.py:Class'"
        )
    text = name_or_ref.strip()
    if ":" in text:
        from freeride_lab.sidetasks.loader import parse_task_ref

        return parse_task_ref(text)
    key = _key(text)
    with _lock:
        found = BUILTIN_TASKS.get(key) or _registered.get(key, ("", None))[1]
    if found is not None:
        return found
    known = names()
    near = difflib.get_close_matches(text, known, n=1) or difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise ValueError(
        f"unknown side task {name_or_ref!r}; {hint}known: {', '.join(known)}; or give an "
        "import path 'pkg.module:Class' or a file 'path/to/file.py:Class' (register a name "
        "with freeride_lab.tasks.registry.register)"
    )


def check(name_or_ref: str) -> str:
    """``resolve``, then check that the module or file can be found, without importing it.

    Raises:
        ValueError: as ``resolve``, or a missing file or unfindable module.
    """
    from freeride_lab.sidetasks.loader import check_task_ref

    return check_task_ref(resolve(name_or_ref))


def load(name_or_ref: str) -> type[SideTaskBase]:
    """Import and return the side-task class of a name or a reference (imports torch for the
    built-ins).

    Raises:
        ValueError: as ``resolve``, or as ``sidetasks.loader.load_task_class`` (no such module,
            file or class, or a class that is not a side task).
    """
    from freeride_lab.sidetasks.loader import load_task_class

    return load_task_class(resolve(name_or_ref))


def reference_key(name: str) -> str:
    """The FreeRide reference-throughput key of a task name (a built-in's, else the name)."""
    return REFERENCE_KEYS.get(_key(name), name) if isinstance(name, str) else str(name)
