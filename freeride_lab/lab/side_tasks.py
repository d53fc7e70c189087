"""``SideTaskControls``: the side-task half of ``Session`` — attach, tune, move, checkpoint,
detach, tasks, ledger, cost saving and the overhead governor, and who carries out a command.

``Session`` inherits it; every method here delegates to the run's ``lab.manager``
``SideTaskManager`` (requests; made on first use, so a launch loads none of it),
``lab.harvest`` (what the tasks harvested), ``lab.stages`` (the board's stages) or
``lab.governor`` (the governor's thread). Requests and the governor need the Session that owns
the run; on a read-only observer they raise ``PermissionError``, except that a detached run's
keeper carries out an observer's requests (``_commands``). See ``lab.session`` [Note: owner and
observers] and [Note: side tasks].

    s = Session.launch(RunConfig(workload="synthetic", stages=4, microbatches=4))
    t = s.attach("pagerank", options={"n_nodes": 2000})      # placed, profiled, then stepping
    s.tune(t["id"], budget_ms=20); s.move(t["id"], 2); s.detach(t["id"])
    s.tasks; s.ledger(); s.cost_saving(); s.cost_model(); s.stage_info()
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from freeride_lab.core.config import RunConfig
from freeride_lab.io.rundir import RunDir
from freeride_lab.lab.owner_channel import OwnerClient

if TYPE_CHECKING:
    import pandas as pd

    from freeride_lab.core.accounting import CostModel, CostSaving
    from freeride_lab.core.governor import OverheadGovernor
    from freeride_lab.lab.governor import GovernorLoop
    from freeride_lab.lab.manager import SideTaskManager
    from freeride_lab.lab.tables import EventTables
    from freeride_lab.pipeline.launcher import RunState

log = logging.getLogger(__name__)

__all__ = ["SideTaskControls"]


class SideTaskControls:
    """Side tasks of a run (mixed into ``Session``, which provides the run and its tables)."""

    run_dir: RunDir
    config: RunConfig
    run_id: str
    owner: bool
    _governor: GovernorLoop | None
    #: ``attach(gating="trickle")`` starts the overhead governor when none runs; a caller that
    #: sets trickle duties itself (the benchmark, ticking loops of its own) turns this off.
    govern_trickle_tasks: bool
    _manager: SideTaskManager | None
    _lock: threading.RLock
    _tables: EventTables

    if TYPE_CHECKING:  # provided by Session and its other parts

        @property
        def memory(self) -> pd.DataFrame: ...
        @property
        def steps(self) -> pd.DataFrame: ...
        @property
        def side_task_steps(self) -> pd.DataFrame: ...
        @property
        def mps_active(self) -> bool: ...
        def _recent_bubbles(self, steps: int = 6) -> pd.DataFrame: ...
        def _refresh(self, *, poll_files: bool = True) -> None: ...
        def _state(self, *, poll_files: bool) -> RunState: ...
        def _run_info(self) -> dict[str, Any]: ...
        def _check_owner(self, what: str) -> None: ...
        def _read_only(
            self, what: str, run: Mapping[str, Any], *, also: str = ""
        ) -> PermissionError: ...

    # -- who carries out a command -----------------------------------------------------------

    def _commands(self, what: str) -> SideTaskManager | OwnerClient:
        """What carries out a side-task command: this owner's manager, or the keeper of a
        detached run asked over its channel (``lab.owner_channel``).

        Raises:
            PermissionError: an observer of a run that is not detached.
            RuntimeError: a detached run that has ended (its keeper is gone).
        """
        if self.owner:
            return self._side_tasks()
        run = self._run_info()
        if not run.get("detached"):
            raise self._read_only(what, run)
        state = self._state(poll_files=False)
        if state.done:
            raise RuntimeError(
                f"cannot {what}: run {self.run_id} is {state} and its keeper has gone; side "
                "tasks run only beside a live run"
            )
        return OwnerClient.of_run(run, self.run_dir.secret(), run_id=self.run_id)

    def _side_tasks(self) -> SideTaskManager:
        from freeride_lab.lab.manager import SideTaskManager  # pandas: loaded on first use

        with self._lock:  # the watchdog thread may ask for it too: make exactly one
            if self._manager is None:
                self._manager = SideTaskManager(
                    self.run_dir,
                    self.config,
                    events=self._events_since,
                    memory=lambda: self.memory,
                    bubbles=self._recent_bubbles,
                    live=self._is_live,
                )
            return self._manager

    def _events_since(self, start: int) -> list[dict[str, Any]]:
        self._refresh()
        with self._lock:
            return self._tables.events_since(start)

    def _is_live(self) -> bool:
        return not self._state(poll_files=False).done

    # -- requests ----------------------------------------------------------------------------

    def attach(
        self,
        task: str,
        *,
        stage: int | None = None,
        memory: int | str | None = None,
        sm_pct: float | None = None,
        priority: int = 1,
        budget_ms: float | None = None,
        options: Mapping[str, Any] | None = None,
        policy: str = "KILL",
        gating: str = "bubbles",
        placement: str = "freeride",
    ) -> dict[str, Any]:
        """Run a side task in this run's bubbles; its task dict (see ``tasks``).

        ``task`` is a built-in name (resnet18, resnet50, vgg19, pagerank, sgd_mf, image),
        "pkg.module:Class", "path/file.py:Class", or the id of a detached (or ended) task,
        which then resumes from its checkpoint with its own options, policy, gating and limits
        (``memory``, ``sm_pct``, ``budget_ms`` and ``priority=0`` given here replace them).

        Args:
            stage: where it runs; None places it (free memory, bubble fit, queue length).
            memory: memory cap, bytes or "4GB"/"512MiB"; None = no cap (the profiled request
                is reported).
            sm_pct: SM share 0-100 (MPS only).
            priority: 0 or 1 (default): the MPS client priority, and the order of the stage's
                queue, where a priority-0 task goes first and preempts a priority-1 task at
                its next bubble (``core.task_queue``).
            budget_ms: step budget; None profiles the task inside bubbles first.
            options: keyword arguments of the task class.
            policy: overrun policy: WARN, SHRINK_BUDGET, PAUSE or KILL.
            gating: "bubbles" (managed), "trickle" (managed, and between bubbles as much as
                the overhead governor allows: ``enable_governor`` starts at 1% if it is off),
                "leftovers" (beside the stage's main task, only in the bubble time it leaves:
                bubbles too short for its steps, and the end of each bubble after its last
                step; it waits while the stage has no main task) or "none" (naive: runs
                through training's compute).
            placement: with ``stage=None``, "freeride" (FreeRide's rule: the shortest queue)
                or "harvest" (the stage whose bubbles the task's steps fill most, shared with
                its queue; ``core.placement``).

        Raises:
            ValueError: the request is invalid or no stage can take it; nothing changed.
            RuntimeError: the run is not training, or was launched with side_tasks=False.
            PermissionError: this Session is a read-only observer (from ``Session.open``).
        """
        attached = self._commands("attach or resume side tasks").attach(
            task,
            stage=stage,
            memory=memory,
            sm_pct=sm_pct,
            priority=priority,
            budget_ms=budget_ms,
            options=options,
            policy=policy,
            gating=gating,
            placement=placement,
        )
        if (
            attached.get("gating") == "trickle"
            and self.govern_trickle_tasks
            and self.governor is None
        ):
            self.enable_governor()  # a trickle task's duty is the governor's to set
        return attached

    def tune(
        self,
        task_id: str,
        *,
        memory: int | str | None = None,
        sm_pct: float | None = None,
        priority: int | None = None,
        budget_ms: float | None = None,
        trickle_duty: float | None = None,
    ) -> dict[str, Any]:
        """Change a live task's limits (None = unchanged); its task dict. A memory, SM-share or
        priority change restarts its process from its checkpoint and profiles it again.
        ``trickle_duty`` (0-1, tasks attached with gating "trickle") is the share of the time
        between bubbles it may step; the governor, when on, moves it again.

        Raises:
            ValueError: unknown or ended task, or a bad limit; nothing changed.
            PermissionError: this Session is a read-only observer.
        """
        return self._commands("tune side tasks").tune(
            task_id,
            memory=memory,
            sm_pct=sm_pct,
            priority=priority,
            budget_ms=budget_ms,
            trickle_duty=trickle_duty,
        )

    def move(self, task_id: str, stage: int) -> dict[str, Any]:
        """Move a live task to ``stage`` (checkpoint, stop, resume there); its task dict.

        Raises:
            ValueError: unknown task or stage, or the stage cannot host it; nothing changed.
            PermissionError: this Session is a read-only observer.
        """
        return self._commands("move side tasks").move(task_id, stage)

    def checkpoint(self, task_id: str) -> dict[str, Any]:
        """Save a live side task's state now (it goes on from there); its task dict. A task
        saves on its own every ``checkpoint_interval_s``, at a detach, a move and a stop.

        Raises:
            ValueError: unknown or ended task; nothing sent.
            RuntimeError: the task saved nothing (not started yet, or its process is gone).
            PermissionError: this Session is a read-only observer.
        """
        return self._commands("checkpoint side tasks").checkpoint(task_id)

    def detach(self, task_id: str) -> dict[str, Any]:
        """Checkpoint and stop a side task; its task dict (``attach(task_id)`` resumes it).

        Raises:
            PermissionError: this Session is a read-only observer.
        """
        return self._commands("detach side tasks").detach(task_id)

    @property
    def tasks(self) -> list[dict[str, Any]]:
        """Side tasks of this run, in attach order: id, name, stage, state, progress, unit,
        overruns, memory_bytes, sm_pct, priority, budget_ms, error (and more; see
        ``lab.manager.SideTaskManager.task``)."""
        return self._side_tasks().tasks()

    def ledger(self) -> pd.DataFrame:
        """One row per side task: steps, progress, throughput over training's wall time, busy
        time, overruns (``core.accounting.ledger``)."""
        from freeride_lab.lab.harvest import run_ledger

        return run_ledger(self.side_task_steps, self.steps)

    def cost_saving(
        self, vanilla_step_s: float | None = None, model: CostModel | None = None
    ) -> CostSaving:
        """FreeRide's cost saving of this run, published and overhead-corrected
        (``lab.harvest.run_cost_saving``; ``vanilla_step_s`` None uses this run's steps that
        had no side-task work; ``model`` None uses :meth:`cost_model`)."""
        from freeride_lab.lab.harvest import run_cost_saving

        return run_cost_saving(
            self.steps,
            self.side_task_steps,
            vanilla_step_s=vanilla_step_s,
            model=self.cost_model() if model is None else model,
        )

    def cost_model(self) -> CostModel:
        """FreeRide's cost model plus the ``reference_throughput`` each custom task of this
        run declared on its class (``sidetasks.api.SideTaskBase``), under its task name."""
        from freeride_lab.core.accounting import FREERIDE_REFERENCE_THROUGHPUT_PER_S, CostModel

        declared = {
            record.name: record.reference_throughput
            for record in self._side_tasks().book.records().values()
            if record.reference_throughput is not None
        }
        return CostModel(
            reference_throughput_per_s={**FREERIDE_REFERENCE_THROUGHPUT_PER_S, **declared}
        )

    def stage_info(self) -> list[dict[str, Any]]:
        """One dict per rank for the task board: stage, free_bytes, bubbles_ms, label, …"""
        from freeride_lab.lab.stages import stage_info

        return stage_info(self._side_tasks(), self.memory, self._recent_bubbles())

    def enable_governor(
        self,
        target_frac: float = 0.01,
        *,
        baseline_step_s: float | None = None,
        interval_s: float = 0.5,
        **options: Any,
    ) -> GovernorLoop:
        """Keep side tasks' overhead on training under ``target_frac`` (a daemon thread here).

        Args:
            baseline_step_s: training's step time without side tasks; None learns it from
                steps without side-task work.
            options: further ``core.governor.OverheadGovernor`` settings.

        Raises:
            PermissionError: this Session does not own the run (the governor tunes its tasks).
        """
        from freeride_lab.core.governor import OverheadGovernor

        self._check_owner("run the overhead governor")
        self.disable_governor()
        if not self.mps_active:  # SM shares need MPS: govern step budgets alone
            options = {**options, "sm_min_pct": 100, "sm_max_pct": 100}
        governor = OverheadGovernor(target_frac=target_frac, **options)
        self._governor = self.governor_loop(
            governor, baseline_step_s=baseline_step_s, interval_s=interval_s
        ).start()
        log.info("governor on for %s: target %.2f%%", self.run_id, target_frac * 100)
        return self._governor

    def governor_loop(
        self,
        governor: OverheadGovernor,
        *,
        baseline_step_s: float | None = None,
        interval_s: float = 0.5,
        task_ids: Collection[str] | None = None,
        base_budget_s: Callable[[str], float | None] | None = None,
        trickle: bool = True,
    ) -> GovernorLoop:
        """A governor loop over this run, not started: ``enable_governor`` runs one in a
        thread; a caller with its own loop (the benchmark) calls its ``tick``. Arguments as
        ``lab.governor.GovernorLoop``; SM shares apply where an MPS daemon serves the run.

        Raises:
            PermissionError: this Session does not own the run (the governor tunes its tasks).
        """
        from freeride_lab.lab.governor import GovernorLoop

        self._check_owner("run the overhead governor")
        nproc = len(self._side_tasks().ranks)
        return GovernorLoop(
            self._side_tasks(),
            events=self._events_since,
            live=self._is_live,
            governor=governor,
            ranks=nproc,
            log_path=self.run_dir.path / "governor.jsonl",
            sm_applies=self.mps_active,
            gpu_ordinals=tuple(range(nproc)) if self.config.device == "cuda" else (),
            baseline_step_s=baseline_step_s,
            interval_s=interval_s,
            task_ids=task_ids,
            base_budget_s=base_budget_s,
            trickle=trickle,
        )

    def disable_governor(self) -> None:
        """Stop the governor thread (idempotent); its log stays."""
        if self._governor is not None:
            self._governor.stop()
            self._governor = None

    @property
    def governor(self) -> GovernorLoop | None:
        """The governor thread ``enable_governor`` started, while it runs; else None."""
        loop = self._governor
        return loop if loop is not None and loop.running else None

    @property
    def governor_log(self) -> pd.DataFrame:
        """The governor's decisions (``lab.governor.GOVERNOR_LOG_COLUMNS``), from the run dir."""
        from freeride_lab.lab.governor import governor_log_frame

        return governor_log_frame(self.run_dir.path / "governor.jsonl")
