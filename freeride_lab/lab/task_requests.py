"""A side-task request's arguments, checked before anything is sent to a worker: the task
reference, the limits, and a fresh task id.

    ref, name, unit = check_task("pagerank")         # or "pkg.mod:Class", "file.py:Class"
    limits = limits_of({"memory": "4GiB", "sm_pct": 50, "budget_ms": 20})
    task_id = new_task_id(name, taken={"pagerank-3fa1"})

Each raises ``ValueError`` with one clear message naming the value (``lab.manager``).
"""

from __future__ import annotations

import math
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from freeride_lab.sidetasks.limits import GpuLimits, parse_bytes

__all__ = ["check_task", "limit_changes", "limits_of", "new_task_id"]


def check_task(task: object) -> tuple[str, str, str, float | None]:
    """(reference to send, display name, unit, declared reference throughput) of a task name
    or reference, or ValueError."""
    from freeride_lab.tasks import registry

    if not isinstance(task, str) or not task.strip():
        raise ValueError(
            f"task={task!r} must be a task name ({', '.join(registry.names())}), "
            "'pkg.module:Class' or 'path/file.py:Class'"
        )
    key = task.strip().lower().replace("-", "_")
    if key in registry.BUILTIN_TASKS:
        from freeride_lab.core.accounting import FREERIDE_UNITS

        ref = registry.check(key)
        return ref, key, FREERIDE_UNITS.get(registry.reference_key(key), ""), None
    name = task.strip() if registry.is_known(task) else ""
    ref = registry.resolve(task)
    where, _, cls_name = ref.rpartition(":")
    if where.endswith(".py"):
        ref = f"{Path(where).expanduser().resolve()}:{cls_name}"  # task processes run elsewhere
    cls = registry.load(ref)  # ValueError names what is wrong
    return ref, name or cls_name, str(getattr(cls, "unit", "")), reference_throughput(cls)


def reference_throughput(cls: type) -> float | None:
    """A task class's declared ``reference_throughput`` (None if it declares none), or
    ValueError naming the class, the value and the rule."""
    theta = getattr(cls, "reference_throughput", None)
    if theta is None:
        return None
    number = isinstance(theta, int | float) and not isinstance(theta, bool)
    if not (number and math.isfinite(theta) and theta > 0):
        raise ValueError(
            f"{cls.__name__}.reference_throughput={theta!r} must be a finite number > 0 "
            f"(its {getattr(cls, 'unit', 'units')} per second on the reference GPU), or None "
            "to leave the task out of cost accounting"
        )
    return float(theta)


def limits_of(given: Mapping[str, Any]) -> GpuLimits:
    """A new task's limits: the defaults, with the ones ``given`` (``limit_changes``)."""
    return GpuLimits().replace(**limit_changes(given))


def limit_changes(given: Mapping[str, Any]) -> dict[str, Any]:
    """``GpuLimits`` fields for the limits ``given`` (memory, sm_pct, priority, budget_ms,
    trickle_duty, as ``attach`` and ``tune`` take them; other keys and None values are
    ignored), checked."""
    memory, sm_pct = given.get("memory"), given.get("sm_pct")
    priority, budget_ms = given.get("priority"), given.get("budget_ms")
    changes: dict[str, Any] = {}
    if memory is not None:
        changes["memory_bytes"] = parse_bytes(memory)
        if changes["memory_bytes"] <= 0:
            raise ValueError(f"memory={memory!r} must be > 0 bytes; use None for no cap")
    if sm_pct is not None:
        changes["sm_pct"] = sm_pct
    if priority is not None:
        changes["priority"] = priority
    if budget_ms is not None:
        if (
            isinstance(budget_ms, bool)
            or not isinstance(budget_ms, int | float)
            or not math.isfinite(budget_ms)
            or budget_ms <= 0
        ):
            raise ValueError(
                f"budget_ms={budget_ms!r} must be a number of milliseconds > 0; "
                "use None to profile the task"
            )
        changes["budget_s"] = float(budget_ms) / 1e3
    if given.get("trickle_duty") is not None:
        changes["trickle_duty"] = given["trickle_duty"]
    GpuLimits().replace(**changes)  # the remaining checks, with GpuLimits' messages
    return changes


def new_task_id(name: str, taken: set[str]) -> str:
    slug = re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).strip("-.")[:40] or "task"
    while True:
        task_id = f"{slug}-{secrets.token_hex(2)}"
        if task_id not in taken:
            return task_id
