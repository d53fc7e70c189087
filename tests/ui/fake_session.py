"""A small in-memory stand-in for ``Session`` with its side-task API, for fast UI tests.

Its tables come from the planner (``core.plan.simulate``: the real actions schema); ``advance``
adds steps as a live run would. Side-task calls validate like a session does (memory above a
stage's free memory, unknown ids, sm_pct out of range) and raise ``ValueError`` to refuse.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any, Unpack

import pandas as pd

from freeride_lab.core import bubbles as core_bubbles
from freeride_lab.core.accounting import CostSaving
from freeride_lab.core.config import RunConfig
from freeride_lab.core.plan import Costs, simulate
from freeride_lab.io.rundir import RunDir
from freeride_lab.lab.tables import SIDE_TASK_STEP_COLUMNS, STEP_COLUMNS
from freeride_lab.lab.task_commands import AttachOptions, LimitChanges
from freeride_lab.pipeline.launcher import RunState

GIB = 1024**3
FREE_BYTES = [8 * GIB, 2 * GIB, 4 * GIB, 4 * GIB]


class FakeSession:
    """See the module docstring. ``steps`` advance with :meth:`advance`; ``finish`` ends it."""

    bubble_min_ms = 0.0

    owner = True

    def __init__(
        self,
        *,
        stages: int = 2,
        microbatches: int = 2,
        steps: int = 10,
        run_dir: Path = Path("/tmp/fake-run"),
    ) -> None:
        self.config = RunConfig(
            schedule="1F1B",
            stages=stages,
            microbatches=microbatches,
            steps=steps,
            workload="synthetic",
            run_dir=str(run_dir),
        )
        self.run_dir = RunDir(run_dir)
        self.run_id = "fake-run-<b>1</b>"
        self._state = RunState.RUNNING
        self._done_steps = 0
        self._tasks: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(1)
        self._side_rows: list[dict[str, Any]] = []
        self.calls: list[tuple[Any, ...]] = []

    def __repr__(self) -> str:
        return f"<FakeSession run_id={self.run_id!r} state={self._state} step={self._done_steps}>"

    # -- run -----------------------------------------------------------------------------------

    def advance(self, steps: int = 1) -> None:
        self._done_steps = min(self._done_steps + steps, self.config.steps)
        for task in self._tasks.values():
            task["progress"] += 10.0 * steps
            task["state"] = "RUNNING"
        for step in range(self._done_steps - steps, self._done_steps):
            for task in self._tasks.values():
                self._side_rows.append(
                    {
                        "task_id": task["id"],
                        "name": task["name"],
                        "stage": task["stage"],
                        "rank": task["stage"],
                        "step": step,
                        "start_ms": step * 20.0 + 1.0,
                        "end_ms": step * 20.0 + 3.0,
                        "duration_ms": 2.0,
                        "progress": 10.0,
                        "unit": task["unit"],
                        "overrun_ms": 0.0,
                    }
                )

    def finish(self, state: RunState = RunState.FINISHED) -> None:
        self._state = state

    def stop(self, grace_s: float | None = None) -> None:
        self.calls.append(("stop", grace_s))
        if not self._state.done:
            self._state = RunState.STOPPED

    @property
    def failure(self) -> None:
        return None

    @property
    def state(self) -> RunState:
        return self._state

    @property
    def steps_done(self) -> int:
        return self._done_steps

    @property
    def actions(self) -> pd.DataFrame:
        if self._done_steps == 0:
            return simulate("1F1B", self.config.stages, self.config.microbatches).iloc[:0]
        return simulate(
            "1F1B",
            self.config.stages,
            self.config.microbatches,
            costs=Costs(forward_ms=1.0, backward_input_ms=1.0, backward_weight_ms=1.0),
            steps=self._done_steps,
        )

    @property
    def bubbles(self) -> pd.DataFrame:
        cfg = self.config
        return core_bubbles.extract_bubbles(
            self.actions,
            steps=self.steps,
            schedule=cfg.schedule,
            stages=cfg.stages,
            microbatches=cfg.microbatches,
        )

    @property
    def steps(self) -> pd.DataFrame:
        rows = [
            {
                "step": s,
                "rank": r,
                "start_ms": s * 20.0,
                "end_ms": s * 20.0 + 18.0,
                "duration_ms": 18.0,
                "optimizer_ms": 0.5,
                "loss": 1.0,
                "tokens": 64,
                "optimizer_start_ms": math.nan,  # simulated steps run back to back
                "optimizer_end_ms": math.nan,
            }
            for s in range(self._done_steps)
            for r in range(self.config.stages)
        ]
        return pd.DataFrame(rows, columns=list(STEP_COLUMNS))

    def summary(self) -> pd.DataFrame:
        cfg = self.config
        return core_bubbles.summary(
            self.actions, cfg.schedule, cfg.stages, cfg.microbatches, cfg.chunks, skip_steps=0
        )

    @property
    def side_task_steps(self) -> pd.DataFrame:
        return pd.DataFrame(self._side_rows, columns=list(SIDE_TASK_STEP_COLUMNS))

    def ledger(self) -> pd.DataFrame:
        from freeride_lab.core.accounting import ledger

        return ledger(self.side_task_steps)

    def cost_saving(self, vanilla_step_s: float | None = None, model: Any = None) -> CostSaving:
        if not self._side_rows:
            raise ValueError("no side-task progress yet")
        return CostSaving(
            overhead_frac=0.01,
            reference_gpus=0.2,
            hourly_cost=21.8,
            hourly_cost_usd=3.9,
            saving_published_frac=0.05,
            saving_corrected_frac=0.04,
        )

    # -- side tasks ----------------------------------------------------------------------------

    @property
    def tasks(self) -> list[dict[str, Any]]:
        return [dict(t) for t in self._tasks.values()]

    def stage_info(self) -> list[dict[str, Any]]:
        return [
            {
                "stage": s,
                "free_bytes": FREE_BYTES[s % len(FREE_BYTES)],
                "bubbles_ms": [2.0, 3.0],
                "label": f"stage {s}",
            }
            for s in range(self.config.stages)
        ]

    def attach(self, task: str, **request: Unpack[AttachOptions]) -> dict[str, Any]:
        memory, sm_pct = request.get("memory"), request.get("sm_pct")
        priority, budget_ms = request.get("priority", 1), request.get("budget_ms")
        stage = request.get("stage")
        self.calls.append(
            ("attach", task, stage, memory, sm_pct, priority, budget_ms, request.get("options"))
        )
        if self._state.done:
            raise RuntimeError(f"run {self.run_id} is {self._state}; attach needs a live run")
        stage = 0 if stage is None else int(stage)
        self._check(stage=stage, memory=memory, sm_pct=sm_pct)
        name = task.rpartition(":")[2] if ":" in task else task
        task_id = f"t{next(self._ids)}"
        self._tasks[task_id] = {
            "id": task_id,
            "name": name,
            "stage": stage,
            "state": "SUBMITTED",
            "progress": 0.0,
            "unit": "iterations",
            "overruns": 0,
            "memory_bytes": memory,
            "sm_pct": sm_pct,
            "priority": priority,
            "budget_ms": budget_ms,
            "error": "",
            "ref": task,
        }
        return dict(self._tasks[task_id])

    def tune(self, task_id: str, **limits: Unpack[LimitChanges]) -> dict[str, Any]:
        given: list[Any] = [
            limits.get(key) for key in ("memory", "sm_pct", "priority", "budget_ms")
        ]
        self.calls.append(("tune", task_id, *given))
        task = self._task(task_id)
        self._check(stage=task["stage"], memory=given[0], sm_pct=given[1])
        task_keys = ("memory_bytes", "sm_pct", "priority", "budget_ms")  # the task dict's names
        for key, value in zip(task_keys, given, strict=True):
            if value is not None:
                task[key] = value
        return dict(task)

    def move(self, task_id: str, stage: int) -> dict[str, Any]:
        self.calls.append(("move", task_id, stage))
        task = self._task(task_id)
        self._check(stage=stage, memory=task["memory_bytes"], sm_pct=None)
        task["stage"] = stage
        return dict(task)

    def checkpoint(self, task_id: str) -> dict[str, Any]:
        self.calls.append(("checkpoint", task_id))
        task = self._task(task_id)
        if task["state"] not in ("RUNNING", "PAUSED"):
            raise RuntimeError(f"could not checkpoint {task_id}: its process is not started yet")
        return dict(task)

    def detach(self, task_id: str) -> dict[str, Any]:
        self.calls.append(("detach", task_id))
        task = self._task(task_id)
        del self._tasks[task_id]
        return {**task, "state": "STOPPED"}

    def _task(self, task_id: str) -> dict[str, Any]:
        if task_id not in self._tasks:
            raise ValueError(f"unknown task {task_id!r}; tasks: {', '.join(self._tasks) or 'none'}")
        return self._tasks[task_id]

    def _check(self, *, stage: int, memory: Any, sm_pct: float | None) -> None:
        if not 0 <= stage < self.config.stages:
            raise ValueError(f"stage={stage} is not in 0..{self.config.stages - 1}")
        free = FREE_BYTES[stage % len(FREE_BYTES)]
        if memory is not None and int(memory) >= free:
            raise ValueError(f"memory={int(memory)} bytes >= stage {stage}'s free {free} bytes")
        if sm_pct is not None and not 0 < sm_pct <= 100:
            raise ValueError(f"sm_pct={sm_pct} must be in (0, 100]")

    # -- display and report --------------------------------------------------------------------

    def report(self, path: str | Path) -> Path:
        from freeride_lab.ui.report import write_session_report

        return write_session_report(self, path)

    def _repr_mimebundle_(
        self, include: Any = None, exclude: Any = None, **kwargs: Any
    ) -> dict[str, Any]:
        from freeride_lab.ui.dashboard import mimebundle

        return mimebundle(self, include, exclude)
