"""``SideTaskManager``: side tasks of one run — attach, tune, move, detach, and what they did.

The Session that owns the run holds one (``session.attach(...)`` and friends delegate here);
an observer's Session holds one only to read ``tasks`` (everything it needs is in the run
directory) and sends no requests (``lab.session`` [Note: owner and observers]).

    mgr.attach("pagerank", options={"n_nodes": 2000})       # placed by core.placement
    mgr.attach("my_tasks.py:Count", stage=2, memory="1GiB", budget_ms=20)
    mgr.tune("pagerank-3fa1", sm_pct=50)                    # restarts it; it is profiled again
    mgr.move("pagerank-3fa1", 3)                            # checkpoint, then resume on stage 3
    mgr.detach("pagerank-3fa1")                             # checkpoint and stop
    mgr.attach("pagerank-3fa1")                             # re-attach: continues from it
    mgr.tasks()                                             # one dict per task

Every request is validated before anything is sent to a worker (task reference, limits, stage,
memory against the stage's free memory, the bubble-fit rule); a rejection raises ``ValueError``
with one clear message and changes nothing. Requests on a run that cannot take them (finished,
or launched with ``side_tasks=False``) raise ``RuntimeError``.

# [Note: what the run directory holds per task]
``<run_dir>/tasks/<task_id>/`` holds ``task.json`` (written here: the reference, options,
limits, rank and stage, who set the budget; see ``TaskRecord``), ``checkpoint.pt`` (the task
process) and ``profile.json`` (the task process, see ``task_host`` [Note: profiling in
bubbles]). State, progress, overruns and errors come from the events
(``side_task_state``/``side_task_step`` in ``events/task-<id>.jsonl`` and
``events/worker-<r>.jsonl``); the latest accepted state event by time wins. A task id names
the checkpoint, so moving a task or attaching a detached task id again keeps its progress.

# [Note: stages and ranks]
Workers run per rank, so a side task sits on a rank; a task's ``stage`` is that rank's lowest
stage index (the same convention as the ``bubbles`` table). ``stage=`` arguments accept any
stage index the rank holds (multi-chunk schedules hold several).

# [Note: placement inputs]
Free memory per rank comes from ``core.bubbles.free_memory`` over the run's memory reports;
predicted bubble lengths from ``core.bubbles.predict_bubbles`` over its bubbles; queues from the
live tasks of each rank (placement priority: MPS client priority 0 counts as more important
than 1). Early in a run, before the first step has been measured, a missing input switches its
rule off and the returned dict's ``placement`` says so.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from freeride_lab.core.config import RunConfig
from freeride_lab.core.events import ControlAck, SideTaskStateChanged, to_json
from freeride_lab.core.placement import NoPlacement, QueuedTask, StageInfo, TaskRequest, place
from freeride_lab.core.schedule import Schedule, stage_indices
from freeride_lab.core.sidetask_state import SideTaskEvent, SideTaskState, is_terminal
from freeride_lab.io.rundir import RunDir
from freeride_lab.lab.harvest import free_bytes_by_rank, predicted_bubbles_by_rank
from freeride_lab.lab.taskbook import TaskBook, TaskRecord
from freeride_lab.sidetasks.limits import GpuLimits, parse_bytes
from freeride_lab.sidetasks.proctree import kill_tree
from freeride_lab.sidetasks.spec import GATINGS, TaskSpec, parse_overrun_policy
from freeride_lab.sidetasks.watchdog import worker_hang_reason
from freeride_lab.sidetasks.worker_exit import read_exit

log = logging.getLogger(__name__)

__all__ = ["SideTaskManager", "TaskRecord", "WorkerLike"]

_UNKNOWN_FREE_BYTES = 2**62  # stands in for "not measured yet": the memory rule passes
_EXIT_RECORD_WAIT_S = 2.0  # a rank records its dead worker's exit status well within this
_WORKER_WAIT_S = 120.0  # how long a request waits for a starting rank's worker


class WorkerLike(Protocol):
    """What the manager sends to a rank's worker (``sidetasks.client.WorkerClient``)."""

    def attach(self, spec: TaskSpec) -> ControlAck: ...
    def tune(self, task_id: str, **limits: Any) -> ControlAck: ...
    def detach(self, task_id: str) -> ControlAck: ...


class SideTaskManager:
    """Side tasks of one run (see the module docstring).

    Args:
        events: ``events(start)`` returns the run's event dicts from index ``start`` on.
        memory, bubbles: the run's ``memory`` and ``bubbles`` tables, now.
        live: True while the run trains (side tasks can be attached).
        client: the worker of a rank; None = ``WorkerClient.from_run_dir``, waiting up to
            ``worker_wait_s`` for a rank that is still starting.
    """

    def __init__(
        self,
        run_dir: RunDir,
        config: RunConfig,
        *,
        events: Callable[[int], Sequence[Mapping[str, Any]]],
        memory: Callable[[], pd.DataFrame],
        bubbles: Callable[[], pd.DataFrame],
        live: Callable[[], bool],
        client: Callable[[int], WorkerLike] | None = None,
        worker_wait_s: float = _WORKER_WAIT_S,
    ) -> None:
        self.run_dir = run_dir
        self.config = config
        self.book = TaskBook(run_dir, events)
        self._memory = memory
        self._bubbles = bubbles
        self._live = live
        self._client_factory = client
        self._secret: bytes | None = None  # read once, on the first command
        self.worker_wait_s = worker_wait_s
        self._lock = threading.RLock()
        self._hung_workers: dict[int, tuple[int, str]] = {}  # rank -> (pid, why it was killed)
        self._gone_since: dict[tuple[int, int], float] = {}  # (rank, pid) -> when found gone
        spec = Schedule.from_name(config.schedule)
        nproc = config.stages // config.nnodes
        self.ranks = list(range(config.node_rank * nproc, (config.node_rank + 1) * nproc))
        self._stages_of = {
            r: stage_indices(spec, r, config.stages, config.chunks or 1) for r in self.ranks
        }
        self._rank_of = {s: r for r, ss in self._stages_of.items() for s in ss}

    def __repr__(self) -> str:
        return f"<SideTaskManager({str(self.run_dir.path)!r}, tasks={len(self.book.records())})>"

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
    ) -> dict[str, Any]:
        """Attach ``task`` (a reference, or the id of a detached task to resume); its dict.

        Args:
            stage: a stage index; None places it (``core.placement``).
            memory: device-memory cap, bytes or a size string ("4GB", "512MiB"); None = none
                (its profiled request is reported once measured).
            sm_pct: share of the GPU's SMs (MPS only), 0-100.
            priority: MPS client priority, 0 normal or 1 below normal.
            budget_ms: the step budget; None profiles the task (``task_host``).
            options: keyword arguments of the task class (JSON values).
            policy: overrun policy (WARN, SHRINK_BUDGET, PAUSE, KILL).
            gating: "bubbles" (managed) or "none" (naive co-location, for comparisons).

        Raises:
            ValueError: the request is invalid or no stage can take it; nothing was sent.
            RuntimeError: the run cannot take side tasks (finished, or ``side_tasks=False``).
        """
        with self._lock:
            self._check_live()
            records = self.book.records()
            previous = records.get(task) if isinstance(task, str) else None
            if previous is not None:
                return self._reattach(previous, stage, memory, sm_pct, priority, budget_ms)
            if options is not None and not isinstance(options, Mapping):
                raise ValueError(f"options={options!r} must be a dict of keyword arguments")
            if gating not in GATINGS:
                raise ValueError(f"gating={gating!r} is unknown; valid: {', '.join(GATINGS)}")
            policy = str(parse_overrun_policy(policy))
            ref, name, unit, theta = _check_task(task)
            limits = _limits(memory, sm_pct, priority, budget_ms)
            record = TaskRecord(
                id=_new_id(name, set(records)),
                task=ref,
                name=name,
                rank=-1,
                stage=-1,
                options=dict(options or {}),
                limits=limits.to_dict(),
                policy=policy,
                gating=gating,
                user_budget_s=limits.budget_s,
                unit=unit,
                reference_throughput=theta,
            )
            record.spec()  # validates options (JSON) and the rest before anything is sent
            rank, note = self._choose_rank(record, limits, stage)
            record.rank, record.stage, record.placement = rank, self._lowest(rank), note
            ack = self._send_attach(record)
            record.attached_ns = record.limits_ns = ack.t_ns
            self.book.save(record)
            self.book.set_state(record.id, SideTaskState.SUBMITTED, ack.t_ns)
            log.info("attached %s (%s) to stage %d: %s", record.id, ref, record.stage, note)
            return self.book.view(record)

    def _reattach(
        self,
        record: TaskRecord,
        stage: int | None,
        memory: int | str | None,
        sm_pct: float | None,
        priority: int | None,
        budget_ms: float | None,
    ) -> dict[str, Any]:
        state = self.book.state(record.id)
        if not record.detached and not is_terminal(SideTaskState(state)):
            raise ValueError(
                f"task {record.id!r} is still attached ({state}) on stage {record.stage}; "
                f"detach it first (session.detach({record.id!r})) or tune it"
            )
        changes = _limit_changes(memory, sm_pct, priority if priority != 1 else None, budget_ms)
        limits = GpuLimits.from_dict(record.limits).replace(**changes)
        rank, note = self._choose_rank(record, limits, record.stage if stage is None else stage)
        record.rank, record.stage = rank, self._lowest(rank)
        record.limits, record.detached, record.placement = limits.to_dict(), False, note
        if "budget_s" in changes:
            record.user_budget_s = limits.budget_s
        ack = self._send_attach(record)
        record.limits_ns = ack.t_ns
        self.book.save(record)
        self.book.set_state(record.id, SideTaskState.SUBMITTED, ack.t_ns)
        log.info("re-attached %s to stage %d from its checkpoint", record.id, record.stage)
        return self.book.view(record)

    def tune(
        self,
        task_id: str,
        *,
        memory: int | str | None = None,
        sm_pct: float | None = None,
        priority: int | None = None,
        budget_ms: float | None = None,
        by: str = "user",
    ) -> dict[str, Any]:
        """Change limits of a live task (None = unchanged); its dict.

        A memory, SM-share or priority change restarts the task process from its checkpoint,
        which profiles it again. ``by="governor"`` marks a budget as the governor's, so the
        user's (or the profiled) budget stays the base it scales.

        Raises:
            ValueError: unknown task, a task that is not live, or a bad limit; nothing sent.
        """
        with self._lock:
            self._check_live()
            record = self.book.record(task_id)
            self._check_attached(record, "tune")
            changes = _limit_changes(memory, sm_pct, priority, budget_ms)
            if not changes:
                return self.book.view(record)
            limits = GpuLimits.from_dict(record.limits).replace(**changes)
            if "memory_bytes" in changes:
                self._check_stage(record, limits, record.rank)
            ack = self._call(record.rank, lambda w: w.tune(record.id, **changes))
            if not ack.ok:
                raise ValueError(f"worker of stage {record.stage} refused: {ack.message}")
            record.limits = limits.to_dict()
            if "budget_s" in changes and by == "user":
                record.user_budget_s = limits.budget_s
            if ack.payload.get("restarted"):
                record.limits_ns = ack.t_ns
            self.book.save(record)
            log.info("tuned %s (%s): %s", record.id, by, ack.message)
            return self.book.view(record)

    def move(self, task_id: str, stage: int) -> dict[str, Any]:
        """Move a live task to ``stage``: checkpoint and stop it, start it there; its dict.

        Raises:
            ValueError: unknown task or stage, or the stage cannot host it; nothing changed.
            RuntimeError: the new stage refused it (it was put back where it was).
        """
        with self._lock:
            self._check_live()
            record = self.book.record(task_id)
            self._check_attached(record, "move")
            limits = GpuLimits.from_dict(record.limits)
            rank, note = self._choose_rank(record, limits, stage, moving=True)
            if rank == record.rank:
                return self.book.view(record)
            old_rank = record.rank
            detached = self._call(old_rank, lambda w: w.detach(record.id))
            if not detached.ok:
                raise RuntimeError(f"could not stop {record.id} for the move: {detached.message}")
            record.rank, record.stage, record.placement = rank, self._lowest(rank), note
            try:
                ack = self._send_attach(record, reason="move")
            except (ValueError, RuntimeError, OSError, TimeoutError) as exc:
                record.rank, record.stage = old_rank, self._lowest(old_rank)
                back = self._send_attach(record, reason="move back")
                record.limits_ns = back.t_ns
                self.book.save(record)
                raise RuntimeError(
                    f"stage {stage} refused {record.id} ({exc}); it resumed on stage "
                    f"{record.stage} from its checkpoint"
                ) from None
            record.limits_ns = ack.t_ns
            self.book.save(record)
            self.book.set_state(record.id, SideTaskState.SUBMITTED, ack.t_ns)
            log.info("moved %s from stage %d to %d", record.id, self._lowest(old_rank), stage)
            return self.book.view(record)

    def detach(self, task_id: str) -> dict[str, Any]:
        """Checkpoint and stop a task and take it off its worker; its dict. Idempotent."""
        with self._lock:
            record = self.book.record(task_id)
            if record.detached:
                return self.book.view(record)
            if self._live() and self.book.live(record):
                ack = self._call(record.rank, lambda w: w.detach(record.id))
                if ack.ok:
                    state = str(ack.payload.get("state", SideTaskState.STOPPED))
                    self.book.set_state(record.id, state, ack.t_ns)
                elif not ack.message.startswith("no task"):
                    raise RuntimeError(f"could not detach {record.id}: {ack.message}")
            record.detached = True
            self.book.save(record)
            log.info("detached %s", record.id)
            return self.book.view(record)

    # -- views -------------------------------------------------------------------------------

    def tasks(self) -> list[dict[str, Any]]:
        """Every task attached to this run, in attach order (see ``task``)."""
        with self._lock:
            self._check_workers()
            records = sorted(self.book.records().values(), key=lambda r: (r.attached_ns, r.id))
            return [self.book.view(r) for r in records]

    def task(self, task_id: str) -> dict[str, Any]:
        """One task as a dict: id, name, stage, state, progress, unit, overruns, memory_bytes,
        sm_pct, priority, budget_ms, error; plus rank, task (reference), gating, policy, steps,
        profile (dict or None), placement, detached.

        ``memory_bytes`` is the cap in force, else the profiled request (whole GiB) once known;
        ``budget_ms`` the budget in force (set, or profiled), None while profiling.

        Raises:
            ValueError: unknown task id.
        """
        with self._lock:
            self._check_workers()
            return self.book.view(self.book.record(task_id))

    def check_workers(self) -> bool:
        """Kill hung workers (``_kill_hung_workers``), then fail the tasks of workers that died
        or were killed (``_check_workers``) unless a request holds the manager right now;
        whether it checked. The session's watchdog calls this."""
        self._kill_hung_workers()
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._check_workers()
            return True
        finally:
            self._lock.release()

    def ids(self) -> list[str]:
        """Task ids, in attach order."""
        return [t["id"] for t in self.tasks()]

    def base_budget_s(self, task_id: str) -> float | None:
        """The budget a governor scales: the user's, else the current profile's."""
        record = self.book.record(task_id)
        if record.user_budget_s is not None:
            return record.user_budget_s
        profile = self.book.profile(record)
        return None if profile is None else float(profile["budget_s"])

    # -- internals: validation ---------------------------------------------------------------

    def _kill_hung_workers(self) -> None:
        """SIGKILL every worker of this node that is silent for three heartbeats (SIGSTOPped,
        starved; see ``sidetasks.watchdog``), with its task processes, and remember why.

        Takes no lock: a request waiting on a hung worker must not shield it from this.
        """
        for rank in self.ranks:
            pid = _worker_pid(self.run_dir.path, rank)
            if pid is None or self._hung_workers.get(rank, (None, ""))[0] == pid:
                continue
            hung = worker_hang_reason(self.run_dir.path, rank, pid)
            if hung is None:
                continue
            cause = f"{hung}; killed it and its task processes (SIGKILL)"
            self._hung_workers[rank] = (pid, cause)  # before the kill: its tasks fail with it
            log.warning("%s", cause)
            kill_tree(pid)

    def _check_workers(self) -> None:
        """Fail the tasks of a worker that died (SIGKILL, OOM killer) or that
        ``_kill_hung_workers`` killed: nothing else would say so.

        A task counts as the worker's if its state is not terminal, or if its process stopped
        itself because the worker's channel closed (reason "worker exited"); a worker that
        ends normally stops its tasks with other reasons first, so those are left alone. The
        reason says how the worker died, as its rank recorded it (``sidetasks.worker_exit``).
        """
        by_rank: dict[int, list[TaskRecord]] = {}
        for record in self.book.records().values():
            if not record.detached and self._worker_owns(record):
                by_rank.setdefault(record.rank, []).append(record)
        for rank, records in by_rank.items():
            cause = self._worker_death(rank)
            if cause is None:
                continue
            reason = f"{cause}; see {self.run_dir.logs_dir}/worker-{rank}.log"
            # Read again: what the worker wrote before it ended is all in its files now.
            records = [r for r in records if self._worker_owns(r)]
            now = time.time_ns()
            for record in records:
                log.warning("task %s failed: %s", record.id, reason)
                self.book.fail(record.id, reason, now)
                self._record_failure(record, reason, now)

    def _worker_death(self, rank: int) -> str | None:
        """How the worker of ``rank`` died; None while it runs, before it started, or after a
        normal exit (code 0: it ended its tasks itself, their events may still be on the way).

        A worker found gone without its rank's record of how (the rank has not reaped it yet,
        or died too) is given ``_EXIT_RECORD_WAIT_S`` for the record to appear.
        """
        ended = read_exit(self.run_dir.path, rank)
        if ended is not None and ended.normal:
            return None
        pid = ended.pid if ended is not None else _worker_pid(self.run_dir.path, rank)
        if pid is None or (ended is None and _process_alive(pid)):
            return None
        killed_pid, cause = self._hung_workers.get(rank, (None, ""))
        if killed_pid == pid:
            return cause
        if ended is not None:
            return f"worker for rank {rank} died: {ended.how} (pid {pid})"
        gone_since = self._gone_since.setdefault((rank, pid), time.monotonic())
        if time.monotonic() - gone_since < _EXIT_RECORD_WAIT_S:
            return None
        return (
            f"worker for rank {rank} died: pid {pid} is gone, and its rank recorded no exit "
            "status (it may have died too)"
        )

    def _worker_owns(self, record: TaskRecord) -> bool:
        """Whether the task's fate is its worker's: not ended, or stopped by its channel closing."""
        state, reason = self.book.observed(record.id)
        orphaned = state == SideTaskState.STOPPED and reason == "worker exited"
        return orphaned or not is_terminal(SideTaskState(state))

    def _record_failure(self, record: TaskRecord, reason: str, t_ns: int) -> None:
        """Write the FAIL to the run directory, so a later ``Session.open`` sees it too: one
        line, appended in one write, to ``events/lab-<rank>.jsonl`` (no process writes there)."""
        event = SideTaskStateChanged(
            task_id=record.id,
            name=record.name,
            stage=record.stage,
            state=str(SideTaskState.FAILED),
            t_ns=t_ns,
            event=str(SideTaskEvent.FAIL),
            reason=reason,
        )
        path = self.run_dir.events_dir / f"lab-{record.rank}.jsonl"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (to_json(event) + "\n").encode())
            finally:
                os.close(fd)
        except OSError as exc:  # the tables in memory still say FAILED
            log.warning("cannot record the failure of task %s in %s: %s", record.id, path, exc)

    def _check_live(self) -> None:
        if not self.config.side_tasks:
            raise RuntimeError(
                f"run {self.run_dir.path.name} was launched with side_tasks=False (vanilla): it "
                "has no side-task workers; launch with RunConfig(side_tasks=True)"
            )
        if not self.config.runtime.edges_factory:
            raise RuntimeError(
                f"run {self.run_dir.path.name} has no side-task workers (its config has no "
                "runtime.edges_factory); launch it with Session.launch and side_tasks=True"
            )
        if not self._live():
            raise RuntimeError(
                f"run {self.run_dir.path.name} is not training (finished, failed or stopped); "
                "side tasks run only beside a live run"
            )

    def _check_attached(self, record: TaskRecord, what: str) -> None:
        state = self.book.state(record.id)
        if record.detached or is_terminal(SideTaskState(state)):
            raise ValueError(
                f"cannot {what} task {record.id!r}: it is {state}"
                f"{' (detached)' if record.detached else ''}; attach it again with "
                f"session.attach({record.id!r})"
            )

    def _rank_for(self, stage: object) -> int:
        if isinstance(stage, bool) or not isinstance(stage, int) or stage not in self._rank_of:
            valid = sorted(self._rank_of)
            span = f"{valid[0]}..{valid[-1]}" if valid else "none"
            raise ValueError(
                f"stage={stage!r} is out of range: this run's stages here are {span} "
                f"({len(self.ranks)} rank(s) on node {self.config.node_rank})"
            )
        return self._rank_of[stage]

    def _lowest(self, rank: int) -> int:
        return min(self._stages_of[rank])

    def stages_of(self, rank: int) -> list[int]:
        """The stage indices ``rank`` holds, ascending."""
        return sorted(self._stages_of[rank])

    def _choose_rank(
        self, record: TaskRecord, limits: GpuLimits, stage: int | None, *, moving: bool = False
    ) -> tuple[int, str]:
        """The rank for ``record`` under ``limits``, and how it was chosen (placement rules)."""
        infos, notes = self._stage_infos(exclude=record.id)
        if record.gating == "none":
            # Naive co-location runs through training compute, so bubbles do not bound its steps.
            infos = {r: dataclasses.replace(info, bubble_ms=None) for r, info in infos.items()}
            notes.append('gating="none": bubble-fit rule not applied')
        budget_s = limits.budget_s if limits.budget_s is not None else self._budget_s(record)
        if budget_s is None:
            notes.append("step budget not known until the task is profiled")
        request = TaskRequest(
            name=record.name,
            memory_bytes=limits.memory_bytes or 0,
            budget_s=budget_s or 0.0,
            priority=1 - limits.priority,
            task_id=record.id,
        )
        if stage is None:
            outcome = place(request, list(infos.values()))
            if isinstance(outcome, NoPlacement):
                raise ValueError(outcome.reason)
            rank = self._rank_of[outcome.stage]
            how = f"placed on stage {outcome.stage}"
        else:
            rank = self._rank_for(stage)
            if not (moving and rank == record.rank):
                outcome = place(request, [infos[rank]])
                if isinstance(outcome, NoPlacement):
                    refusal = outcome.refusals[0]
                    raise ValueError(
                        f"stage {stage} cannot host {record.name!r}: {refusal.rule}: "
                        f"{refusal.detail}; fix: lower its memory or budget_ms, or pick another "
                        "stage (session.stage_info() lists free memory and bubbles)"
                    )
            how = f"stage {stage} as asked"
        return rank, "; ".join([how, *notes])

    def _check_stage(self, record: TaskRecord, limits: GpuLimits, rank: int) -> None:
        self._choose_rank(record, limits, self._lowest(rank))

    def _stage_infos(self, *, exclude: str = "") -> tuple[dict[int, StageInfo], list[str]]:
        """Placement's view of each rank (keyed by rank), plus notes on what is not known."""
        notes: list[str] = []
        free = free_bytes_by_rank(self._memory())
        if not free:
            notes.append("free memory not measured yet (no step done): memory rule skipped")
        predicted = predicted_bubbles_by_rank(self._bubbles())
        if not predicted:
            notes.append("bubbles not measured yet: bubble-fit rule skipped")
        queues: dict[int, list[QueuedTask]] = {r: [] for r in self.ranks}
        for record in self.book.records().values():
            if record.id == exclude or not self.book.live(record):
                continue
            if record.rank in queues:
                priority = 1 - int(record.limits.get("priority", 1))
                queues[record.rank].append(QueuedTask(record.id, priority))
        infos = {
            r: StageInfo(
                stage=self._lowest(r),
                free_bytes=free.get(r, _UNKNOWN_FREE_BYTES) if free else _UNKNOWN_FREE_BYTES,
                bubble_ms=tuple(predicted.get(r, ())) if predicted else None,
                queue=tuple(queues[r]),
            )
            for r in self.ranks
        }
        return infos, notes

    def _budget_s(self, record: TaskRecord) -> float | None:
        if record.limits.get("budget_s") is not None:
            return float(record.limits["budget_s"])
        profile = self.book.profile(record)
        return None if profile is None else float(profile["budget_s"])

    # -- internals: workers ------------------------------------------------------------------

    def _client(self, rank: int) -> WorkerLike:
        if self._client_factory is not None:
            return self._client_factory(rank)
        from freeride_lab.sidetasks.client import WorkerClient

        if self._secret is None:
            self._secret = self.run_dir.secret()
        deadline = time.monotonic() + self.worker_wait_s
        while True:
            try:
                return WorkerClient.from_run_dir(
                    self.run_dir.path, rank, timeout_s=1.0, secret=self._secret
                )
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"the side-task worker of rank {rank} did not start within "
                        f"{self.worker_wait_s:g} s; see {self.run_dir.logs_dir}/worker-{rank}.log"
                    ) from None
                if not self._live():
                    raise RuntimeError(
                        f"run {self.run_dir.path.name} ended before the worker of rank {rank} "
                        "was up"
                    ) from None

    def _call(self, rank: int, command: Callable[[WorkerLike], ControlAck]) -> ControlAck:
        """Send one command to the worker of ``rank``.

        Raises:
            RuntimeError: the worker is not listening, or did not answer in time.
        """
        worker = self._client(rank)
        try:
            return command(worker)
        except (ConnectionError, TimeoutError) as exc:
            raise RuntimeError(
                f"the side-task worker of stage {self._lowest(rank)} did not answer ({exc}); "
                "is the run still training?"
            ) from None

    def _send_attach(self, record: TaskRecord, *, reason: str = "attach") -> ControlAck:
        spec = record.spec()
        ack = self._call(record.rank, lambda w: w.attach(spec))
        if not ack.ok:
            raise ValueError(f"stage {record.stage} refused {record.id} ({reason}): {ack.message}")
        return ack


# --- pure helpers -----------------------------------------------------------------------------


def _worker_pid(run_dir: Path, rank: int) -> int | None:
    """The pid the worker of ``rank`` published, or None before it did."""
    from freeride_lab.sidetasks.client import worker_address_file

    try:
        pid = json.loads(worker_address_file(run_dir, rank).read_text()).get("pid")
    except (OSError, ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) and pid > 0 else None


def _process_alive(pid: int) -> bool:
    """Running (a zombie, killed but not yet reaped by its rank, is not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _check_task(task: object) -> tuple[str, str, str, float | None]:
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
    return ref, name or cls_name, str(getattr(cls, "unit", "")), _reference_throughput(cls)


def _reference_throughput(cls: type) -> float | None:
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


def _limits(
    memory: int | str | None, sm_pct: float | None, priority: int | None, budget_ms: float | None
) -> GpuLimits:
    return GpuLimits().replace(**_limit_changes(memory, sm_pct, priority, budget_ms))


def _limit_changes(
    memory: int | str | None, sm_pct: float | None, priority: int | None, budget_ms: float | None
) -> dict[str, Any]:
    """``GpuLimits`` fields for the given (not None) arguments, checked."""
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
    GpuLimits().replace(**changes)  # the remaining checks, with GpuLimits' messages
    return changes


def _new_id(name: str, taken: set[str]) -> str:
    slug = re.sub(r"[^a-z0-9_.-]+", "-", name.lower()).strip("-.")[:40] or "task"
    while True:
        task_id = f"{slug}-{secrets.token_hex(2)}"
        if task_id not in taken:
            return task_id
