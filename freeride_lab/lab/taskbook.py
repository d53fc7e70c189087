"""``TaskBook``: the side tasks of a run as its directory and its events tell them.

The run directory is the one truth (see ``lab.manager`` [Note: what the run directory holds
per task]): ``tasks/<id>/task.json`` is a ``TaskRecord`` (written by the manager), the state,
progress and errors come from ``side_task_state``/``side_task_step`` events, the profile from
``tasks/<id>/profile.json``. Any process that can read the run directory builds the same book.

    book = TaskBook(run_dir, events=lambda start: all_events[start:])
    book.records()                      # id -> TaskRecord
    book.view(book.record("pagerank-3fa1"))["progress"]
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from freeride_lab.core.budget import overran
from freeride_lab.core.sidetask_state import SideTaskEvent, SideTaskState, is_terminal
from freeride_lab.io.rundir import RunDir
from freeride_lab.sidetasks.limits import GpuLimits
from freeride_lab.sidetasks.spec import TaskSpec, parse_overrun_policy, profile_path

log = logging.getLogger(__name__)

__all__ = ["TaskBook", "TaskRecord"]

_STATE_EVENTS = {str(e) for e in SideTaskEvent} | {""}  # "" = the worker's attach note


@dataclass(kw_only=True)
class TaskRecord:
    """One attached task as ``tasks/<id>/task.json`` keeps it (see [Note: what the run
    directory holds per task]).

    Args:
        task: the reference sent to the worker (file paths made absolute).
        limits: ``GpuLimits.to_dict()`` in force.
        user_budget_s: the budget a user set (attach or tune); None = the profiled one.
        limits_ns: when limits or the host process last changed; a profile written before it
            is stale.
        placement: how the stage was chosen, in words.
        reference_throughput: the task class's declared ``reference_throughput`` (units per
            second on the cost model's reference GPU); None for built-ins and for custom
            tasks that declare none.
    """

    id: str
    task: str
    name: str
    rank: int
    stage: int
    options: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=dict)
    policy: str = "KILL"
    gating: str = "bubbles"
    user_budget_s: float | None = None
    unit: str = ""
    reference_throughput: float | None = None
    attached_ns: int = 0
    limits_ns: int = 0
    detached: bool = False
    placement: str = ""

    def spec(self) -> TaskSpec:
        """The ``TaskSpec`` a worker gets for this record (a task name, as older run
        directories recorded it, resolved into its reference)."""
        from freeride_lab.tasks import registry

        return TaskSpec(
            task=registry.resolve(self.task),
            task_id=self.id,
            name=self.name,
            options=dict(self.options),
            limits=GpuLimits.from_dict(self.limits),
            overrun_policy=parse_overrun_policy(self.policy),
            gating=self.gating,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TaskRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class _Observed:
    """What the events say about one task."""

    state: str = str(SideTaskState.SUBMITTED)
    state_t_ns: int = -1
    reason: str = ""
    error: str = ""
    progress: float = 0.0
    steps: int = 0
    overruns: int = 0
    unit: str = ""


class TaskBook:
    """Records (files) and observations (events) of one run's side tasks.

    Args:
        events: ``events(start)`` returns the run's event dicts from index ``start`` on; the
            book folds only the new ones on each call.
    """

    def __init__(self, run_dir: RunDir, events: Callable[[int], Sequence[Mapping[str, Any]]]):
        self.run_dir = run_dir
        self._events = events
        self._seen = 0
        self._observed: dict[str, _Observed] = {}

    def _tasks_dir(self) -> Path:
        return self.run_dir.path / "tasks"

    def records(self) -> dict[str, TaskRecord]:
        out: dict[str, TaskRecord] = {}
        root = self._tasks_dir()
        if not root.is_dir():
            return out
        for path in sorted(root.glob("*/task.json")):
            try:
                record = TaskRecord.from_dict(json.loads(path.read_text()))
            except (OSError, ValueError, TypeError) as exc:
                log.warning("skipping unreadable %s: %s", path, exc)
                continue
            out[record.id] = record
        return out

    def record(self, task_id: str) -> TaskRecord:
        """The record of ``task_id``.

        Raises:
            ValueError: unknown id; the message lists the known ones.
        """
        records = self.records()
        record = records.get(task_id)
        if record is None:
            known = ", ".join(records) or "none"
            raise ValueError(f"no side task {task_id!r} in this run; attached: {known}")
        return record

    def save(self, record: TaskRecord) -> None:
        """Write ``record`` (atomically)."""
        path = self._tasks_dir() / record.id / "task.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.run_dir.write_json(path, dataclasses.asdict(record))

    def profile(self, record: TaskRecord) -> dict[str, Any] | None:
        """The task's latest profile, if it was measured under its current limits."""
        try:
            data = json.loads(profile_path(self.run_dir.path, record.id).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or int(data.get("t_ns", 0)) < record.limits_ns:
            return None  # measured before the last restart: a new profile is on its way
        return data

    def _observe(self) -> dict[str, _Observed]:
        """Fold the events that arrived since the last call into ``_observed``."""
        new = self._events(self._seen)
        self._seen += len(new)
        for e in new:
            kind = e.get("kind")
            if kind not in ("side_task_state", "side_task_step"):
                continue
            seen = self._observed.setdefault(str(e.get("task_id", "")), _Observed())
            if kind == "side_task_step":
                seen.progress += float(e.get("progress") or 0.0)
                seen.steps += 1
                seen.overruns += overran(e.get("overrun_ns"))
                seen.unit = str(e.get("unit") or seen.unit)
                continue
            if not e.get("accepted", True) or str(e.get("event", "")) not in _STATE_EVENTS:
                continue  # a refused event or a note (OVERRUN, PROFILE): the state holds
            t_ns = int(e.get("t_ns", 0))
            if t_ns < seen.state_t_ns:
                continue  # an older event read late (files are read one after the other)
            seen.state, seen.state_t_ns = str(e.get("state", seen.state)), t_ns
            seen.reason = str(e.get("reason", ""))
            if seen.state == SideTaskState.FAILED:
                seen.error = seen.reason or "failed (no reason given)"
        return self._observed

    def state(self, task_id: str) -> str:
        """The task's state as the events say (SUBMITTED before any)."""
        return self._observe().get(task_id, _Observed()).state

    def live(self, record: TaskRecord) -> bool:
        """Attached and not in a terminal state."""
        return not record.detached and not is_terminal(SideTaskState(self.state(record.id)))

    def set_state(self, task_id: str, state: str, t_ns: int) -> None:
        """What a worker's ack said at ``t_ns`` (e.g. SUBMITTED on attach), until newer events."""
        seen = self._observe().setdefault(task_id, _Observed())
        if t_ns >= seen.state_t_ns:
            seen.state, seen.state_t_ns, seen.reason = str(state), t_ns, ""

    def observed(self, task_id: str) -> tuple[str, str]:
        """(state, reason of the latest state) as the events say."""
        seen = self._observe().get(task_id, _Observed())
        return seen.state, seen.reason

    def fail(self, task_id: str, reason: str, t_ns: int) -> None:
        """Mark a task FAILED for a reason no event can carry (its worker died), from ``t_ns``
        on; a newer event from the task itself still wins."""
        seen = self._observe().setdefault(task_id, _Observed())
        if t_ns >= seen.state_t_ns:
            seen.state, seen.state_t_ns = str(SideTaskState.FAILED), t_ns
            seen.reason = seen.error = reason

    def view(self, record: TaskRecord) -> dict[str, Any]:
        """The task dict: id, name, stage, state, progress, unit, overruns, memory_bytes,
        sm_pct, priority, budget_ms, error; plus rank, task (reference), gating, trickle_duty,
        policy, steps, profile (dict or None), placement, detached, reason (of the latest state).

        ``memory_bytes`` is the cap in force, else the profiled request (whole GiB) once known;
        ``budget_ms`` the budget in force (set, or profiled), None while profiling.
        """
        seen = self._observe().get(record.id, _Observed())
        limits = GpuLimits.from_dict(record.limits)
        profile = self.profile(record)
        memory = limits.memory_bytes
        if memory is None and profile is not None:
            memory = int(profile["memory_request_bytes"])
        budget_s = limits.budget_s
        if budget_s is None and profile is not None:
            budget_s = float(profile["budget_s"])
        return {
            "id": record.id,
            "name": record.name,
            "stage": record.stage,
            "state": seen.state,
            "progress": seen.progress,
            "unit": seen.unit or record.unit,
            "overruns": seen.overruns,
            "memory_bytes": memory,
            "sm_pct": limits.sm_pct,
            "priority": limits.priority,
            "budget_ms": None if budget_s is None else round(budget_s * 1e3, 6),
            "error": seen.error if seen.state == SideTaskState.FAILED else "",
            "rank": record.rank,
            "task": record.task,
            "gating": record.gating,
            "trickle_duty": limits.trickle_duty,
            "policy": record.policy,
            "steps": seen.steps,
            "profile": profile,
            "placement": record.placement,
            "detached": record.detached,
            "reason": seen.reason,
        }
