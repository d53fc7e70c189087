"""``SideTaskManager``: side tasks of one run — attach, tune, move, checkpoint, detach, and what
they did.

The Session that owns the run holds one (``session.attach(...)`` and friends delegate here);
an observer's Session holds one only to read ``tasks`` (everything it needs is in the run
directory) and sends no requests (``lab.session`` [Note: owner and observers]).

    mgr.attach("pagerank", options={"n_nodes": 2000})       # placed by core.placement
    mgr.attach("my_tasks.py:Count", stage=2, memory="1GiB", budget_ms=20)
    mgr.tune("pagerank-3fa1", sm_pct=50)                    # restarts it; it is profiled again
    mgr.move("pagerank-3fa1", 3)                            # checkpoint, then resume on stage 3
    mgr.checkpoint("pagerank-3fa1")                         # save its state now
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

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, Unpack

from freeride_lab.core.budget import tight_step_budget_s
from freeride_lab.core.config import RunConfig
from freeride_lab.core.events import ControlAck
from freeride_lab.core.placement import placement_policy
from freeride_lab.core.sidetask_state import SideTaskState, is_terminal
from freeride_lab.io.rundir import RunDir
from freeride_lab.lab.stages import StagePlacer
from freeride_lab.lab.task_commands import AttachOptions, LimitChanges, check_keywords
from freeride_lab.lab.task_requests import check_task, limit_changes, limits_of, new_task_id
from freeride_lab.lab.taskbook import TaskBook, TaskRecord
from freeride_lab.lab.worker_health import WorkerHealth
from freeride_lab.sidetasks.limits import GpuLimits
from freeride_lab.sidetasks.spec import GATINGS, TaskSpec, parse_overrun_policy

if TYPE_CHECKING:  # the tables come from the session; listing tasks needs no pandas
    import pandas as pd

log = logging.getLogger(__name__)

__all__ = ["SideTaskManager", "TaskRecord", "WorkerLike"]

_WORKER_WAIT_S = 120.0  # how long a request waits for a starting rank's worker


class WorkerLike(Protocol):
    """What the manager sends to a rank's worker (``sidetasks.client.WorkerClient``)."""

    def attach(self, spec: TaskSpec) -> ControlAck: ...
    def tune(self, task_id: str, **limits: Any) -> ControlAck: ...
    def detach(self, task_id: str) -> ControlAck: ...
    def checkpoint(self, task_id: str) -> ControlAck: ...


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
        self._live = live
        self._client_factory = client
        self._secret: bytes | None = None  # read once, on the first command
        self.worker_wait_s = worker_wait_s
        self._lock = threading.RLock()
        self.placer = StagePlacer(config, self.book, memory=memory, bubbles=bubbles)
        self.ranks = self.placer.ranks
        self._health = WorkerHealth(run_dir, ranks=self.ranks, book=self.book)

    def __repr__(self) -> str:
        return f"<SideTaskManager({str(self.run_dir.path)!r}, tasks={len(self.book.records())})>"

    # -- requests ----------------------------------------------------------------------------

    def attach(self, task: str, **request: Unpack[AttachOptions]) -> dict[str, Any]:
        """Attach ``task`` (a reference, or the id of a detached task to resume); its dict.

        The keyword arguments and their defaults are ``Session.attach``'s: ``stage`` None
        places the task (``core.placement``), ``budget_ms`` None profiles it (``task_host``),
        ``gating="none"`` co-locates it naively (for comparisons).

        Raises:
            ValueError: the request is invalid or no stage can take it; nothing was sent.
            RuntimeError: the run cannot take side tasks (finished, or ``side_tasks=False``).
            TypeError: an argument that ``attach`` does not take.
        """
        check_keywords("attach", request, AttachOptions)
        with self._lock:
            self._check_live()
            records = self.book.records()
            previous = records.get(task) if isinstance(task, str) else None
            if previous is not None:
                return self._reattach(previous, request)
            options = request.get("options")
            if options is not None and not isinstance(options, Mapping):
                raise ValueError(f"options={options!r} must be a dict of keyword arguments")
            gating = request.get("gating", "bubbles")
            if gating not in GATINGS:
                raise ValueError(f"gating={gating!r} is unknown; valid: {', '.join(GATINGS)}")
            policy = str(parse_overrun_policy(request.get("policy", "KILL")))
            ref, name, unit, theta = check_task(task)
            limits = limits_of(request)
            record = TaskRecord(
                id=new_task_id(name, set(records)),
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
            placement = placement_policy(request.get("placement", "freeride"))
            rank, note = self.placer.choose_rank(
                record, limits, request.get("stage"), policy=placement
            )
            record.rank, record.stage, record.placement = rank, self.placer.lowest(rank), note
            ack = self._send_attach(record)
            record.attached_ns = record.limits_ns = ack.t_ns
            self.book.save(record)
            self.book.set_state(record.id, SideTaskState.SUBMITTED, ack.t_ns)
            log.info("attached %s (%s) to stage %d: %s", record.id, ref, record.stage, note)
            return self.book.view(record)

    def _reattach(self, record: TaskRecord, request: AttachOptions) -> dict[str, Any]:
        state = self.book.state(record.id)
        if not record.detached and not is_terminal(SideTaskState(state)):
            raise ValueError(
                f"task {record.id!r} is still attached ({state}) on stage {record.stage}; "
                f"detach it first (session.detach({record.id!r})) or tune it"
            )
        given: dict[str, Any] = dict(request)
        if given.get("priority") == 1:  # the default: the task keeps the priority it had
            del given["priority"]
        placement = placement_policy(given.pop("placement", "freeride"))
        changes = limit_changes(given)
        limits = GpuLimits.from_dict(record.limits).replace(**changes)
        stage = request.get("stage")
        where = record.stage if stage is None else stage
        rank, note = self.placer.choose_rank(record, limits, where, policy=placement)
        record.rank, record.stage = rank, self.placer.lowest(rank)
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
        self, task_id: str, *, by: str = "user", **limits: Unpack[LimitChanges]
    ) -> dict[str, Any]:
        """Change limits of a live task (as ``Session.tune``; None = unchanged); its dict.

        A memory, SM-share or priority change restarts the task process from its checkpoint,
        which profiles it again. ``by="governor"`` marks a budget as the governor's, so the
        user's (or the profiled) budget stays the base it scales.

        Raises:
            ValueError: unknown task, a task that is not live, or a bad limit; nothing sent.
            TypeError: an argument that ``tune`` does not take.
        """
        check_keywords("tune", limits, LimitChanges)
        with self._lock:
            self._check_live()
            record = self.book.record(task_id)
            self._check_attached(record, "tune")
            changes = limit_changes(limits)
            if not changes:
                return self.book.view(record)
            if changes.get("trickle_duty") and record.gating != "trickle":
                raise ValueError(
                    f"trickle_duty={changes['trickle_duty']!r}: {record.id} steps with gating "
                    f"{record.gating!r}; only a task attached with gating 'trickle' steps "
                    "between bubbles"
                )
            tuned = GpuLimits.from_dict(record.limits).replace(**changes)
            if "memory_bytes" in changes:
                self.placer.check_stage(record, tuned, record.rank)
            ack = self._call(record.rank, lambda w: w.tune(record.id, **changes))
            if not ack.ok:
                raise ValueError(f"worker of stage {record.stage} refused: {ack.message}")
            record.limits = tuned.to_dict()
            if "budget_s" in changes and by == "user":
                record.user_budget_s = tuned.budget_s
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
            rank, note = self.placer.choose_rank(record, limits, stage, moving=True)
            if rank == record.rank:
                return self.book.view(record)
            old_rank = record.rank
            detached = self._call(old_rank, lambda w: w.detach(record.id))
            if not detached.ok:
                raise RuntimeError(f"could not stop {record.id} for the move: {detached.message}")
            record.rank, record.stage, record.placement = rank, self.placer.lowest(rank), note
            try:
                ack = self._send_attach(record, reason="move")
            except (ValueError, RuntimeError, OSError, TimeoutError) as exc:
                record.rank, record.stage = old_rank, self.placer.lowest(old_rank)
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
            log.info("moved %s from stage %d to %d", record.id, self.placer.lowest(old_rank), stage)
            return self.book.view(record)

    def checkpoint(self, task_id: str) -> dict[str, Any]:
        """Save a live task's state now (the task's own ``checkpoint.pt``; see [Note: what the
        run directory holds per task]); its dict. The task goes on from where it was.

        Raises:
            ValueError: unknown task, or a task that is not live; nothing sent.
            RuntimeError: its worker or its process saved nothing (the reason is given).
        """
        with self._lock:
            self._check_live()
            record = self.book.record(task_id)
            self._check_attached(record, "checkpoint")
            ack = self._call(record.rank, lambda w: w.checkpoint(record.id))
            if not ack.ok:
                raise RuntimeError(f"could not checkpoint {record.id}: {ack.message}")
            log.info("checkpointed %s: %s", record.id, ack.message)
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
            self._health.fail_tasks_of_dead_workers()
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
            self._health.fail_tasks_of_dead_workers()
            return self.book.view(self.book.record(task_id))

    def check_workers(self) -> bool:
        """Kill hung workers, then fail the tasks of workers that died or were killed unless a
        request holds the manager right now (``lab.worker_health``); whether it checked. The
        session's watchdog calls this."""
        self._health.kill_hung()
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._health.fail_tasks_of_dead_workers()
            return True
        finally:
            self._lock.release()

    def ids(self) -> list[str]:
        """Task ids, in attach order."""
        return [t["id"] for t in self.tasks()]

    def base_budget_s(self, task_id: str) -> float | None:
        """The budget a governor scales: the user's, else the guard the current profile gives
        a governed task, its p95 x 1.1 + 0.5 ms (``core.budget.tight_step_budget_s``); an
        ungoverned task keeps FreeRide's, the median rounded up to 10 ms x 1.2. None while
        the task is still being profiled."""
        record = self.book.record(task_id)
        if record.user_budget_s is not None:
            return record.user_budget_s
        profile = self.book.profile(record)
        if profile is None:
            return None
        p95_s = profile.get("p95_step_s")
        if isinstance(p95_s, int | float) and math.isfinite(p95_s) and p95_s >= 0:
            return tight_step_budget_s(float(p95_s))
        return float(profile["budget_s"])  # a profile that did not record its p95

    def stages_of(self, rank: int) -> list[int]:
        """The stage indices ``rank`` holds, ascending."""
        return self.placer.stages_of(rank)

    # -- internals: validation ---------------------------------------------------------------

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
                f"the side-task worker of stage {self.placer.lowest(rank)} did not answer ({exc}); "
                "is the run still training?"
            ) from None

    def _send_attach(self, record: TaskRecord, *, reason: str = "attach") -> ControlAck:
        spec = record.spec()
        ack = self._call(record.rank, lambda w: w.attach(spec))
        if not ack.ok:
            raise ValueError(f"stage {record.stage} refused {record.id} ({reason}): {ack.message}")
        return ack
