"""Built-in side tasks, named as FreeRide ran them (paper §12), importable by name.

=========  ==========================================  ==========  ============================
name       class                                       unit        FreeRide reference key (§13)
=========  ==========================================  ==========  ============================
resnet18   freeride_lab.tasks.vision:ResNet18Task      samples     resnet18
resnet50   freeride_lab.tasks.vision:ResNet50Task      samples     resnet50
vgg19      freeride_lab.tasks.vision:VGG19Task         samples     vgg19
pagerank   freeride_lab.tasks.graph:PageRankTask       iterations  pagerank
sgd_mf     freeride_lab.tasks.graph:SGDMFTask          iterations  sgd
image      freeride_lab.tasks.image:ImageTask          images      image
inference  freeride_lab.tasks.inference:InferenceTask  tokens      none (FreeRide ran none)
=========  ==========================================  ==========  ============================

Every task takes keyword options, ``preset="cpu"`` (default: one step in roughly 50-200 ms on
one core) or ``preset="gpu"`` (FreeRide's sizes), and exposes them as ``cpu_defaults`` and
``gpu_defaults``. Names resolve through ``freeride_lab.tasks.registry`` (the one map from names
to tasks; notebooks register their own there). Importing this package does not import torch:
classes load on demand::

    >>> task_path("ResNet18")
    'freeride_lab.tasks.vision:ResNet18Task'
    >>> cls = load_task_class("pagerank")            # imports torch now
    >>> task = cls(n_nodes=1000, n_edges=5000)
"""

from __future__ import annotations

from freeride_lab.tasks.registry import (
    BUILTIN_TASKS,
    REFERENCE_KEYS,
    register,
    unregister,
)
from freeride_lab.tasks.registry import load as load_task_class
from freeride_lab.tasks.registry import resolve as task_path

__all__ = [
    "BUILTIN_TASKS",
    "REFERENCE_KEYS",
    "load_task_class",
    "register",
    "task_path",
    "unregister",
]
