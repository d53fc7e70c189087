"""What a side task's steps become: ``SideTaskStep`` events, the profile, the overrun policy.

# [Note: profiling in bubbles]
FreeRide profiles a task alone before placing it (paper notes §9). Here the task is measured
where it will run, under the limits it will run with, without hurting training: while the step
budget is unknown, the host launches one step per bubble, and only in a bubble whose predicted
length is at least the largest predicted length of the rank's bubbles seen so far (so never in
the first step it watches, which it needs to see every slot once). After ``profile_steps``
steps (after the task's own ``warmup_steps``, a graph capture say, and never from the first
sample: see below) the median step time and the peak memory make a ``core.budget.Profile``;
the budget is then ``Profile.budget_s()`` (median rounded up to 10 ms x 1.2). With a fixed
budget (given, or set by a tune) the task steps normally and the profile is taken from its
first steps. Either way the profile is reported once per process, as a ``SideTaskStateChanged``
note (event "PROFILE") and as ``<run_dir>/tasks/<task_id>/profile.json``
(``taskspec.profile_path``), which holds the numbers (``Profile`` fields plus budget_s,
memory_request_bytes, t_ns). A new process (a restart for new limits) profiles again.

The first sample is left out even of a task that declares no warm-up: the first step of its
size a process takes pays one-time costs (the device's libraries, the allocator's first
blocks, a kernel's first launch). On an H100, PageRank's first step took 124 ms and the next
ones 0.15-0.41 ms, the image task's 123 ms and then 4.2-4.4 ms
(``benchmarks/first_steps.py``); a five-step p95 with it was 99 ms for both, and a governed
task's base budget, that p95 x 1.1 + 0.5 ms, kept PageRank out of every bubble shorter than
110 ms. A task whose declared warm-up already covers its first step loses nothing more.

Peak memory is the process's peak RSS on CPU and PyTorch's peak reserved memory on CUDA (the
CUDA context is not included).
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

from freeride_lab.core import events as ev
from freeride_lab.core.budget import (
    GIB,
    OverrunActionKind,
    OverrunStats,
    apply_overrun_policy,
    overran,
    profile_from_steps,
)
from freeride_lab.core.sidetask_state import SideTaskEvent
from freeride_lab.io.rundir import RunDir
from freeride_lab.sidetasks.edges import Edge, Phase
from freeride_lab.sidetasks.host.base import OVERRUN_WINDOW, log
from freeride_lab.sidetasks.host.checkpoints import Checkpointing
from freeride_lab.sidetasks.spec import profile_path

__all__ = ["StepAccounting", "training_busy_ns"]


class StepAccounting(Checkpointing):
    """Step events, overrun counts, the profile and the overrun policy of one task."""

    def _budget_ns(self) -> int:
        """The step guard in force: fixed, else the profile's; 0 while profiling."""
        if self._budget_fixed_ns is not None:
            return self._budget_fixed_ns
        profile = self.profile
        if profile is None:
            return 0
        if self._profile_budget[0] is not profile:  # worked out once per profile
            self._profile_budget = (profile, round(profile.budget_s() * 1e9))
        return self._profile_budget[1]

    def _note_ends(self, cur: Edge | None) -> None:
        """Remember the bubble ends that ``cur`` reveals (its own and the one before it)."""
        if cur is None:
            return
        if cur.phase is Phase.BUSY and cur.observed_end_ns is not None:
            self._ends.setdefault((cur.step, cur.slot), cur.observed_end_ns)
        if cur.previous_end_ns is not None:
            self._ends.setdefault((cur.previous_step, cur.previous_slot), cur.previous_end_ns)
        while len(self._ends) > 256:
            self._ends.popitem(last=False)

    def _observed_end_ns(self, bubble: Edge, cur: Edge | None) -> int | None:
        """When ``bubble`` was seen to end, or None while it lasts (see ``Edge``)."""
        if cur is None or cur.seq <= bubble.seq:
            return None
        self._note_ends(cur)
        key = (bubble.step, bubble.slot)
        if key not in self._ends:
            # Both its end edge and the next one were replaced before anyone looked (nobody
            # looks while a step runs): it ended no later than the newest edge began, and, as
            # far as anyone knows, at its predicted end. Take the earlier, so an overrun is
            # rather over- than under-counted; keep it so it does not drift.
            later = [t for t in (cur.start_ns, cur.observed_end_ns) if t is not None and t > 0]
            if bubble.predicted_end_ns is not None:
                later.append(max(bubble.predicted_end_ns, bubble.start_ns))
            self._ends[key] = min(later) if later else bubble.start_ns
        return self._ends[key]

    def _record_step(
        self,
        step: int,
        start_ns: int,
        end_ns: int,
        progress: float,
        overrun_ns: int,
        calls: int = 1,
        *,
        policy: bool = True,
        sample: bool = True,
    ) -> None:
        """An iterative step (or a group of ``calls`` steps: ``host.iterative`` [Note: step
        groups]): its event, a profile sample of one step's time (not for a step smaller than
        the task's largest: ``sample=False``, [Note: step sizes]), the overrun policy (not for
        a step that ran through training's compute by design: ``policy=False``)."""
        self._emit_step(step, start_ns, end_ns, progress, overrun_ns, calls)
        if sample:
            self._sample_profile((end_ns - start_ns) // calls)
        if not policy:
            return  # overruns by design; the policy would only stop it
        self._window.append(overrun_ns)
        if overrun_ns > 0:
            self._apply_overrun_policy()

    def _sample_profile(self, duration_ns: int) -> None:
        if self.profile is not None:
            return
        self._profile_ns.append(duration_ns)
        if len(self._profile_ns) >= self._warmup_steps() + self.spec.task.profile_steps:
            self._finish_profile()

    def _warmup_steps(self) -> int:
        """The samples left out of the profile: the task's own warm-up
        (``IterativeSideTask.warmup_steps``), and at least the first, which pays the process's
        one-time costs (see [Note: profiling in bubbles])."""
        n = getattr(self.task, "warmup_steps", 0)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(
                f"{type(self.task).__name__}.warmup_steps={n!r} must be an integer >= 0"
            )
        return max(n, 1)

    def _finish_profile(self) -> None:
        """Make the ``Profile`` and report it (see [Note: profiling in bubbles])."""
        limits = self.spec.task.limits
        profile = profile_from_steps(
            [d / 1e9 for d in self._profile_ns],
            _peak_memory_bytes(self.spec.device),
            warmup_steps=self._warmup_steps(),
            sm_pct=limits.sm_pct,
            memory_cap_bytes=limits.memory_bytes,
        )
        self.profile = profile
        budget_s = profile.budget_s()
        request_bytes = profile.memory_request_gib * GIB
        fixed = self._budget_fixed_ns
        in_force = f"; budget fixed at {fixed / 1e6:g} ms" if fixed is not None else ""
        text = (
            f"profiled {profile.n_steps} steps: median {profile.median_step_s * 1e3:.2f} ms, "
            f"p95 {profile.p95_step_s * 1e3:.2f} ms, peak memory "
            f"{profile.peak_memory_bytes / 2**20:.0f} MiB -> budget {budget_s * 1e3:g} ms, "
            f"memory request {profile.memory_request_gib} GiB{in_force}"
        )
        log.info("task %s %s", self.spec.task.task_id, text)
        payload = {
            "task_id": self.spec.task.task_id,
            "median_step_s": profile.median_step_s,
            "p95_step_s": profile.p95_step_s,
            # the profiled steps were the largest the task offers: this many of its smallest
            # (``host.iterative`` [Note: step sizes]); placement judges a stage by the smallest
            "top_step_size": self._top_size,
            "peak_memory_bytes": profile.peak_memory_bytes,
            "n_steps": profile.n_steps,
            "sm_pct": profile.sm_pct,
            "memory_cap_bytes": profile.memory_cap_bytes,
            "budget_s": budget_s,
            "memory_request_bytes": request_bytes,
            "budget_in_force_s": self._budget_ns() / 1e9,
            "t_ns": self._now_ns(),
        }
        path = profile_path(self.spec.run_dir, self.spec.task.task_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            RunDir(Path(self.spec.run_dir)).write_json(path, payload)
        except OSError as exc:  # the note below still carries the numbers
            log.warning("task %s: could not write its profile: %s", self.spec.task.task_id, exc)
        self._emit_state("PROFILE", True, text)

    def overrun_stats(self) -> OverrunStats:
        """Every step this host ran and how many overran (``core.budget.overran``)."""
        return OverrunStats(
            steps=self.steps,
            overruns=self.overruns,
            overrun_ns_total=self.overrun_ns_total,
            budget_ns=self._budget_ns(),
        )

    def _emit_step(
        self,
        step: int,
        start_ns: int,
        end_ns: int,
        progress: float,
        overrun_ns: int,
        calls: int = 1,
    ) -> None:
        task = self.task
        assert task is not None
        self.steps += 1
        if overran(overrun_ns):
            self.overruns += 1
            self.overrun_ns_total += overrun_ns
        self.sink.emit(
            ev.SideTaskStep(
                task_id=self.spec.task.task_id,
                name=self.spec.task.display_name,
                stage=self.spec.stage,
                rank=self.spec.rank,
                step=step,
                start_ns=start_ns,
                end_ns=end_ns,
                progress=progress,
                unit=task.unit,
                overrun_ns=overrun_ns,
                seen_ns=self._seen_ns,
                expected_ns=self._expected_ns,
                spin_from_ns=self._spin_from_ns,
                spin_until_ns=self._spin_until_ns,
                guard_ns=self._entry_guard_ns,
                calls=calls,
            )
        )
        self._entry_guard_ns = 0
        # the first step's only
        self._seen_ns = self._expected_ns = self._spin_from_ns = self._spin_until_ns = 0

    def _apply_overrun_policy(self) -> None:
        stats = OverrunStats.of(self._window, budget_ns=self._budget_ns())
        action = apply_overrun_policy(self._policy, stats)
        if action.kind is OverrunActionKind.NONE:
            return
        if action.kind is OverrunActionKind.WARN:
            if self.steps - self._warned_at_step < OVERRUN_WINDOW:
                return  # once per window
            self._warned_at_step = self.steps
            log.warning("task %s overruns bubbles: %s", self.spec.task.task_id, action.reason)
            self._emit_state("OVERRUN", True, f"overrun policy WARN: {action.reason}")
            return
        self._window.clear()
        if action.kind is OverrunActionKind.SET_BUDGET:
            self._budget_fixed_ns = action.budget_ns
            self._emit_state("OVERRUN", True, f"overrun policy SHRINK_BUDGET: {action.reason}")
        elif action.kind is OverrunActionKind.PAUSE:
            self._policy_paused = True
            self._emit_state(
                "OVERRUN", True, f"overrun policy PAUSE (resume() to continue): {action.reason}"
            )
        elif action.kind is OverrunActionKind.STOP:
            self._checkpoint("overrun")
            self._apply(SideTaskEvent.STOP, f"overrun policy KILL: {action.reason}")


def training_busy_ns(first: Edge | None, last: Edge | None, start_ns: int, end_ns: int) -> int:
    """Gating "none": the part of [start_ns, end_ns] during which training computed, as far as
    the edges seen at its start (``first``) and end (``last``) tell."""
    idle_ns = 0
    if first is not None and first.in_bubble:
        # the bubble open at the start lasted until its end edge (or is still open)
        first_end = end_ns
        if last is not None and last.seq > first.seq:
            same = (last.step, last.slot) == (first.step, first.slot)
            first_end = last.observed_end_ns if same and last.observed_end_ns else start_ns
            if not same and last.previous_end_ns is not None:
                first_end = last.previous_end_ns
        idle_ns += max(0, min(end_ns, first_end) - start_ns)
    if last is not None and last.in_bubble and (first is None or last.seq != first.seq):
        idle_ns += max(0, end_ns - max(start_ns, last.start_ns))
    return max(0, (end_ns - start_ns) - idle_ns)


def _peak_memory_bytes(device: str) -> int:
    """Peak memory of this task process: PyTorch's peak reserved on CUDA, peak RSS on CPU."""
    torch = sys.modules.get("torch")
    if device.startswith("cuda") and torch is not None and torch.cuda.is_initialized():
        index = torch.device(device).index or 0
        return int(torch.cuda.max_memory_reserved(index))
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return int(peak_kib) * 1024
