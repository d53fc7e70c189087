"""How a side task is named on screen: one label per code name, shown beside it.

    >>> task_label("sgd_mf")
    'SGD-MF'
    >>> task_caption("sgd_mf", "t3")
    'SGD-MF · sgd_mf · t3'

Code, commands and tables spell a task by its code name (``sgd_mf``); the dashboard titles it
with its label (``SGD-MF``) and keeps the code name and the task id next to it (in the card's
text, a tooltip or a hover), so a search for either spelling finds it. A name without a label
(a user task) is its own label.
"""

from __future__ import annotations

__all__ = ["TASK_TITLES", "task_caption", "task_label"]

TASK_TITLES = {
    "resnet18": "ResNet-18",
    "resnet50": "ResNet-50",
    "vgg19": "VGG-19",
    "pagerank": "PageRank",
    "sgd_mf": "SGD-MF",
    "image": "Image resize",
}


def task_label(name: str) -> str:
    """The display label of side task ``name`` (its code name when it has none)."""
    return TASK_TITLES.get(name, name)


def task_caption(name: str, task_id: str | None = None) -> str:
    """Label, code name (when it differs) and id, joined with " · ", for tooltips and hovers."""
    parts = [task_label(name)]
    if parts[0] != name:
        parts.append(name)
    if task_id:
        parts.append(task_id)
    return " · ".join(parts)
