"""What a side task is, as it travels: ``TaskSpec`` (what users attach) and ``HostSpec``.

    >>> ref = "freeride_lab.tasks.vision:ResNet18Task"
    >>> spec = TaskSpec(task=ref, task_id="r18", limits={"memory_bytes": "4GiB"})
    >>> TaskSpec.from_dict(spec.to_dict()) == spec
    True
    >>> spec.limits.memory_bytes
    4294967296

Both are frozen, validated on construction and round-trip through plain JSON (``to_dict`` /
``from_dict``), because they cross process boundaries: notebook → worker → task process.
A task's files live under ``<run_dir>/tasks/<task_id>/`` (``checkpoint_path``,
``profile_path``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from freeride_lab.core.budget import OverrunPolicy
from freeride_lab.sidetasks.edges import edge_path
from freeride_lab.sidetasks.limits import GpuLimits
from freeride_lab.sidetasks.loader import parse_task_ref

__all__ = [
    "GATINGS",
    "HostSpec",
    "TaskSpec",
    "checkpoint_path",
    "parse_overrun_policy",
    "profile_path",
    "profiled_top_size",
]

#: How a task meets training: "bubbles" steps only inside bubbles (managed, FreeRide);
#: "trickle" also between them, paced; "leftovers" steps only in the bubble time the stage's
#: main task leaves (bubbles too short for its steps, and what follows its last step in a
#: bubble; ``host.iterative`` [Note: leftovers]); "none" runs it continuously beside training
#: (naive co-location, for comparisons).
GATINGS = ("bubbles", "trickle", "leftovers", "none")

_TASK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """A side task as it is attached to a worker (plain JSON through ``to_dict``).

    Args:
        task: "pkg.module:Class" or "path/file.py:Class" (names resolve above this floor, in
            ``freeride_lab.tasks.registry``).
        task_id: unique per run; "" lets the worker assign one. Names the checkpoint folder.
        name: display name; "" uses ``task``.
        options: keyword arguments of the task class.
        limits: the task's ``GpuLimits`` (a dict is accepted).
        overrun_policy: what the host does when its steps keep overrunning bubble ends (a hung
            step is killed under every policy, see ``hang_after_s``).
        hang_after_s: the slack of the hang rule: a step running longer than 2 x its budget +
            this is hung, and its process is killed from outside (``sidetasks.watchdog``).
        pause_grace_s: imperative tasks: time between a bubble end and SIGSTOP at the latest.
        checkpoint_interval_s: periodic checkpoints while paused.
        gating: "bubbles" (step only inside bubbles), "trickle" (inside bubbles, and between
            them paced to ``limits.trickle_duty``; iterative tasks only), "leftovers" (only in
            the bubble time the stage's main task leaves; iterative tasks only) or "none" (run
            continuously, for comparisons); see ``GATINGS``.
        profile_steps: steps measured for the task's ``Profile`` (median step time, peak
            memory); without a fixed budget they are taken one per bubble, in the largest
            bubbles only (see ``task_host`` [Note: profiling in bubbles]).
    """

    task: str
    task_id: str = ""
    name: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    limits: GpuLimits = field(default_factory=GpuLimits)
    overrun_policy: OverrunPolicy = OverrunPolicy.WARN
    hang_after_s: float = 1.0
    pause_grace_s: float = 0.005
    checkpoint_interval_s: float = 60.0
    gating: str = "bubbles"
    profile_steps: int = 5

    def __post_init__(self) -> None:
        parse_task_ref(self.task)
        if self.task_id and not _TASK_ID.match(self.task_id):
            raise ValueError(
                f"task_id={self.task_id!r} must be 1-64 letters, digits, '_', '.' or '-', "
                "starting with a letter or digit (it names a folder)"
            )
        if isinstance(self.limits, Mapping):
            object.__setattr__(self, "limits", GpuLimits.from_dict(self.limits))
        if not isinstance(self.limits, GpuLimits):
            raise TypeError(f"limits={self.limits!r} must be a GpuLimits or a dict of its fields")
        object.__setattr__(self, "overrun_policy", parse_overrun_policy(self.overrun_policy))
        if not isinstance(self.options, dict):
            raise TypeError(f"options={self.options!r} must be a dict of keyword arguments")
        try:
            json.dumps(self.options)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"options must be JSON values (they cross processes): {exc}") from exc
        for name, low in (("hang_after_s", 0.0), ("checkpoint_interval_s", 0.0)):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > low):
                raise ValueError(f"{name}={value!r} must be a finite number of seconds > 0")
        if self.gating not in GATINGS:
            raise ValueError(f"gating={self.gating!r} is unknown; valid: {', '.join(GATINGS)}")
        if isinstance(self.profile_steps, bool) or not isinstance(self.profile_steps, int):
            raise ValueError(f"profile_steps={self.profile_steps!r} must be an integer >= 1")
        if self.profile_steps < 1:
            raise ValueError(f"profile_steps={self.profile_steps!r} must be an integer >= 1")
        if not (math.isfinite(self.pause_grace_s) and self.pause_grace_s >= 0):
            raise ValueError(f"pause_grace_s={self.pause_grace_s!r} must be >= 0 seconds")

    @property
    def display_name(self) -> str:
        return self.name or self.task

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["limits"] = self.limits.to_dict()
        data["overrun_policy"] = str(self.overrun_policy)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskSpec:
        """Rebuild from ``to_dict`` output or user JSON.

        Raises:
            ValueError: an unknown key (the message lists the valid ones) or a bad value.
        """
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            keys = ", ".join(map(repr, unknown))
            raise ValueError(f"unknown task spec key(s) {keys}; valid: {', '.join(names)}")
        if "task" not in data:
            raise ValueError("task spec needs 'task': 'pkg.module:Class' or 'path/file.py:Class'")
        return cls(**dict(data))


def parse_overrun_policy(value: object) -> OverrunPolicy:
    """``value`` as an ``OverrunPolicy``, matched without regard to case.

    Raises:
        ValueError: an unknown policy (the message lists the valid ones).
    """
    try:
        return OverrunPolicy(str(value).upper())
    except ValueError:
        valid = ", ".join(p.value for p in OverrunPolicy)
        raise ValueError(f"overrun_policy={value!r} is unknown; valid: {valid}") from None


@dataclass(frozen=True, kw_only=True)
class HostSpec:
    """What one task process needs: the task plus where it runs (filled in by the worker).

    Args:
        device: "cpu" or "cuda:<i>" (the CUDA ordinal as the task process sees it).
        edge_file: the edges the host steps by; "" = the rank's, ``edge_path(run_dir, rank)``
            (a leftovers task's are the main task's hand-ons, ``leftovers_path``).
        leftovers_file: where the host hands on the bubble time it leaves, to the stage's
            leftovers task; "" = nowhere.
        control_fd: the host's end of the worker's socketpair; -1 = no worker (tests).
        mps_active: an MPS daemon serves the run (limits came in the environment).
        beacon_fd: the shared memory the host marks its steps and waits in, for the worker's
            watchdog (``sidetasks.heartbeat.TaskBeacon``); -1 = none.
    """

    task: TaskSpec
    run_dir: str
    rank: int
    stage: int
    device: str = "cpu"
    edge_file: str = ""
    leftovers_file: str = ""
    control_fd: int = -1
    mps_active: bool = False
    beacon_fd: int = -1

    @property
    def edges(self) -> Path:
        return Path(self.edge_file) if self.edge_file else edge_path(self.run_dir, self.rank)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "task": self.task.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostSpec:
        return cls(**{**data, "task": TaskSpec.from_dict(data["task"])})


def checkpoint_path(run_dir: str | os.PathLike[str], task_id: str) -> Path:
    """Where the checkpoint of ``task_id`` lives."""
    return Path(run_dir) / "tasks" / task_id / "checkpoint.pt"


def profile_path(run_dir: str | os.PathLike[str], task_id: str) -> Path:
    """Where the task process of ``task_id`` writes its latest profile (JSON)."""
    return Path(run_dir) / "tasks" / task_id / "profile.json"


def profiled_top_size(profile: Mapping[str, object] | None) -> int | None:
    """How many of its smallest steps the task's profiled step was (its profile's
    ``top_step_size``); None where the profile does not say, or says something else than a
    whole number >= 1.

        >>> profiled_top_size({"top_step_size": 4}), profiled_top_size({"top_step_size": True})
        (4, None)
    """
    top = None if profile is None else profile.get("top_step_size")
    return top if isinstance(top, int) and not isinstance(top, bool) and top >= 1 else None
