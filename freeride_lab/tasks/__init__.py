"""Built-in side tasks, named as FreeRide ran them (paper §12), importable by name.

========  ======================================  ==========  ==========================
name      class                                   unit        FreeRide reference key (§13)
========  ======================================  ==========  ==========================
resnet18  freeride_lab.tasks.vision:ResNet18Task  samples     resnet18
resnet50  freeride_lab.tasks.vision:ResNet50Task  samples     resnet50
vgg19     freeride_lab.tasks.vision:VGG19Task     samples     vgg19
pagerank  freeride_lab.tasks.graph:PageRankTask   iterations  pagerank
sgd_mf    freeride_lab.tasks.graph:SGDMFTask      iterations  sgd
image     freeride_lab.tasks.image:ImageTask      images      image
========  ======================================  ==========  ==========================

Every task takes keyword options, ``preset="cpu"`` (default: one step in roughly 50-200 ms on
one core) or ``preset="gpu"`` (FreeRide's sizes), and exposes them as ``cpu_defaults`` and
``gpu_defaults``. Importing this package does not import torch: classes load on demand::

    >>> task_path("ResNet18")
    'freeride_lab.tasks.vision:ResNet18Task'
    >>> cls = load_task_class("pagerank")            # imports torch now
    >>> task = cls(n_nodes=1000, n_edges=5000)
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from freeride_lab.sidetasks.api import SideTaskBase

__all__ = ["BUILTIN_TASKS", "REFERENCE_KEYS", "load_task_class", "task_path"]

#: Built-in task name → ``"module:Class"`` import path.
BUILTIN_TASKS: Mapping[str, str] = MappingProxyType(
    {
        "resnet18": "freeride_lab.tasks.vision:ResNet18Task",
        "resnet50": "freeride_lab.tasks.vision:ResNet50Task",
        "vgg19": "freeride_lab.tasks.vision:VGG19Task",
        "pagerank": "freeride_lab.tasks.graph:PageRankTask",
        "sgd_mf": "freeride_lab.tasks.graph:SGDMFTask",
        "image": "freeride_lab.tasks.image:ImageTask",
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


def task_path(name: str) -> str:
    """The ``"module:Class"`` path of a built-in task (name matched without regard to case).

    A name that already is a ``"module:Class"`` path is returned unchanged.

    Raises:
        ValueError: an unknown name; the message lists the built-in names.
    """
    if ":" in name:
        return name
    key = name.strip().lower().replace("-", "_")
    if key not in BUILTIN_TASKS:
        raise ValueError(
            f"unknown side task {name!r}; built-in: {', '.join(BUILTIN_TASKS)}, "
            "or give an import path 'package.module:Class'"
        )
    return BUILTIN_TASKS[key]


def load_task_class(name: str) -> type[SideTaskBase]:
    """Import and return the class of a built-in task name or a ``"module:Class"`` path.

    Raises:
        ValueError: an unknown built-in name.
        ImportError: the module does not import or lacks the class.
    """
    module_name, _, class_name = task_path(name).partition(":")
    module = importlib.import_module(module_name)
    try:
        cls: type[SideTaskBase] = getattr(module, class_name)
    except AttributeError:
        raise ImportError(f"module {module_name!r} has no class {class_name!r}") from None
    return cls
