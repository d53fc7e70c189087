"""The block driver of ``freeride-lab bench``: one pipeline run, stepped through its segments.

A ``RunDriver`` launches one run (a ``Session``) and for each segment (real stage, side task)
attaches the task, measures it alone, then interleaves blocks of training steps in each mode
through the emulation's control file (see ``bench.driver``), and detaches it: while a segment
measures, its task is the only one attached. Governed blocks
run the session's own governor loop (``lab.governor.GovernorLoop``, ticked from the block's
wait): the benchmark measures the governor users run, not a copy of it. Trickle blocks run a
second loop of the same kind, at the same overhead target, that also sets the task's trickle
duty (gating "trickle"); every other block holds the task at duty 0, in bubbles only.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from freeride_lab.bench import stats as bs
from freeride_lab.bench.devices import nvml_sampler, private_mps_daemon
from freeride_lab.bench.markdown import fmt_calibration
from freeride_lab.bench.profiles import (
    BenchProfile,
    RunPlan,
    Segment,
    instrumentation_stage,
    run_config,
    run_segments,
)
from freeride_lab.bench.readout import collect_blocks, read_calibration, step_calls, task_steps
from freeride_lab.core.budget import step_budget_s, tight_step_budget_s
from freeride_lab.core.config import RunConfig
from freeride_lab.core.governor import OverheadGovernor
from freeride_lab.core.theory import theory_bubble_fraction
from freeride_lab.lab.governor import GovernorLoop, step_times_s
from freeride_lab.pipeline.emulate import Control, ControlFile, Gate

log = logging.getLogger(__name__)

__all__ = ["Progress", "RunDriver", "first_checkpoints_line", "solo_figures"]

_GATE_OF_MODE = {
    "vanilla": Gate.CLOSED,
    "plain": Gate.CLOSED,
    "managed": Gate.PASS,
    "governed": Gate.PASS,
    "trickle": Gate.PASS,
    "naive": Gate.OPEN,
}
_ON_DEVICE = ("PAUSED", "RUNNING")
_ENDED = ("FINISHED", "STOPPED", "FAILED")
_POLL_S = 0.05
_TIMED_STEPS = 4  # step-to-step gaps timed before a run's first segment is estimated
#: a guard no bubble holds, the open gate's hour included, also scaled down to a task's
#: smallest step (a VGG-19 slice's guard is an eighth of its budget: ``host.iterative``
#: [Note: step sizes])
_PARKED_MS = 1e11
Progress = Callable[[str], None]


class RunDriver:
    """Launches one run, drives its segments through the control file, collects its blocks."""

    def __init__(
        self,
        profile: BenchProfile,
        plan: RunPlan,
        run_root: Path,
        deadline: float,
        say: Progress,
        done: frozenset[tuple[str, int]] = frozenset(),
    ) -> None:
        self.profile = profile
        self.plan = plan
        self.done = done  # (case, stage) measured by an earlier call (``bench.resume``)
        self.modes = plan.modes or profile.modes
        self.deadline = deadline
        self.say = say
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.run_dir = (run_root / f"{stamp}-{plan.name}").absolute()
        self.control = ControlFile(self.run_dir)
        self.seq = 0
        self.blocks: list[dict[str, Any]] = []
        self.record: dict[str, Any] = {
            "name": plan.name,
            "microbatches": plan.microbatches,
            "schedule": profile.schedule,
            "chunks": profile.chunks,
            "bubble_limit_frac": theory_bubble_fraction(
                profile.schedule, profile.stages, plan.microbatches, profile.chunks
            ),
            "mps": plan.mps,
            "run_dir": str(self.run_dir),
            "segments": [],
            "skipped": [],
            "skipped_need_s": [],  # what each skipped segment was estimated to take
            "errors": [],
            "governor": [],
        }
        self.session: Any = None
        self.sampler: Any = None
        self._settled_at = 0
        self.hard_deadline = deadline + 20.0  # waits give up here: the budget is spent
        self.step_ms_estimate = 1000.0
        self.setup_s_estimate = 30.0  # a task's attach to on the device; each segment's measured

    # -- plan --

    def config(self) -> RunConfig:
        return run_config(self.profile, self.plan, self.run_dir)

    def segments(self) -> list[Segment]:
        return run_segments(self.profile, self.plan, self.done)

    def pending(self) -> bool:
        """Whether anything is left to measure in this run."""
        stage = instrumentation_stage(self.profile, self.plan, self.done)
        return bool(self.segments()) or stage is not None

    # -- lifetime --

    def execute(self) -> dict[str, Any]:
        """Run it; never raises for a failed run (the record says what went wrong)."""
        try:
            with self._mps(), nvml_sampler() as sampler:
                self.sampler = sampler
                self._launch_and_drive()
        except KeyboardInterrupt:
            self.record["errors"].append("interrupted")
            self.record["interrupted"] = True
            self.say(f"run {self.plan.name} interrupted; stopping it and keeping its blocks")
        except Exception as exc:  # a failed run must not lose the runs before it
            log.exception("bench run %s failed", self.plan.name)
            self.record["errors"].append(f"{type(exc).__name__}: {exc}")
            self.say(f"run {self.plan.name} FAILED: {type(exc).__name__}: {exc}")
        finally:
            if self.session is not None:
                with contextlib.suppress(Exception):
                    self.session.stop()
                failure = self.session.failure
                self.record["state"] = str(self.session.state)
                self.record["failure"] = None if failure is None else str(failure)
        try:
            self.record["blocks_rows"] = self._collect()
        except Exception as exc:
            log.exception("collecting run %s failed", self.plan.name)
            self.record["errors"].append(f"collect: {type(exc).__name__}: {exc}")
        return self.record

    @contextlib.contextmanager
    def _mps(self) -> Iterator[None]:
        if not self.plan.mps:
            yield
            return
        with private_mps_daemon(self.say):
            try:
                yield
            finally:  # the run goes before its daemon
                if self.session is not None:
                    with contextlib.suppress(Exception):
                        self.session.stop()

    def _launch_and_drive(self) -> None:
        from freeride_lab.lab.session import Session

        config = self.config()
        t0 = time.monotonic()
        self.session = Session.launch(config, grace_s=20.0)
        segments = self.segments()
        self._write_control(real_rank=segments[0].stage if segments else 0, gate=Gate.CLOSED)
        self._wait(lambda: self.session.steps_done >= 2, 600.0, "the first training steps")
        self.record["startup_s"] = round(time.monotonic() - t0, 1)
        self.record["calibration"] = read_calibration(self.control.dir, self.profile.stages)
        self.say(f"  training up after {self.record['startup_s']} s; "
                 f"calibration {fmt_calibration(self.record['calibration'])}")  # fmt: skip
        stage = instrumentation_stage(self.profile, self.plan, self.done)
        if stage is not None:
            self._instrumentation(stage)  # no side task attached yet
        self._time_steps()
        for seg in segments:
            need = self._segment_estimate_s()
            left = self.deadline - time.monotonic()
            if left < need:
                note = f"{seg.case}@{seg.stage} ({seg.task}): ~{need:.0f} s, {left:.0f} s left"
                self.record["skipped"].append(note)
                self.record["skipped_need_s"].append(round(need, 1))
                self.say(f"  skip segment {note}")
                continue
            self._segment(seg)
        self._settle()
        self._write_control(real_rank=0, gate=Gate.CLOSED)

    # -- side tasks --

    def _attach(self, seg: Segment, *, leftovers: bool = False) -> str:
        """Attach the segment's task, or the task beside it that takes its leftovers; its id
        (its set-up is timed by the segment, until it is on the device)."""
        task = seg.leftovers if leftovers else seg.task
        gating = "trickle" if "trickle" in self.modes else "bubbles"  # duty 0 = "bubbles"
        # the blocks set every duty; a governor started by the attach would raise it at once
        self.session.govern_trickle_tasks = False
        options = {"preset": self.profile.task_preset,
                   **self.profile.task_options.get(task, {})}  # fmt: skip
        attached = self.session.attach(
            task, stage=seg.stage, options=options, budget_ms=1.0, policy="WARN",
            gating="leftovers" if leftovers else gating,
        )  # fmt: skip
        task_id = str(attached["id"])
        if leftovers:
            seg.leftovers_id = task_id
        else:
            seg.task_id = task_id
        self.say(f"  attached {task}@{seg.stage}{' (leftovers)' if leftovers else ''}")
        return task_id

    def _ready(self, seg: Segment, task_id: str) -> None:
        """Wait until ``task_id`` is on the device."""
        self._wait(
            lambda: self._task(task_id).get("state") in _ON_DEVICE,
            self.profile.attach_timeout_s,
            f"side task {task_id} on stage {seg.stage} to be ready",
            fail_on=lambda: self._task(task_id).get("state") in _ENDED,
            poll_s=0.2,
        )

    def _attached(self) -> int:
        """Side tasks attached and not ended."""
        return sum(1 for t in self.session.tasks if t.get("state") not in _ENDED)

    def _task(self, task_id: str) -> dict[str, Any]:
        for t in self.session.tasks:
            if str(t.get("id")) == task_id:
                return dict(t)
        return {}

    # -- segments --

    def _segment_estimate_s(self) -> float:
        p = self.profile
        blocks = len(self.modes) * p.repeats + 1
        steps = blocks * (p.drop_steps + p.block_steps + 2)
        solo_s = 2 * (p.solo_min_s + 2 * self.step_ms_estimate / 1e3)  # before and after
        return steps * self.step_ms_estimate / 1e3 + solo_s + self.setup_s_estimate + 10.0

    def _instrumentation(self, stage: int) -> None:
        p = self.profile
        self.say(f"  instrumentation: timed vs plain, real stage {stage}")
        seg = Segment(case="instrumentation", stage=stage, task="")
        order = bs.interleave(("vanilla", "plain"), p.instrumentation_repeats, closed=True)
        for repeat, mode in order:
            self._block(seg, repeat, mode)
        self.record["segments"].append(
            {"case": seg.case, "stage": stage, "task": "", "attached_tasks": self._attached()}
        )

    def _segment(self, seg: Segment) -> None:
        p = self.profile
        t0 = time.monotonic()
        rec: dict[str, Any] = {"case": seg.case, "stage": seg.stage, "task": seg.task}
        self.record["segments"].append(rec)
        self._ready(seg, self._attach(seg))
        rec["task_id"] = seg.task_id
        rec["setup_s"] = round(time.monotonic() - t0, 1)
        self.setup_s_estimate = rec["setup_s"]
        rec["attached_tasks"] = self._attached()  # this one alone, unless a detach failed
        solo = self._solo(seg)
        rec.update(solo)
        rec["dedicated_before_per_s"] = rec.pop("dedicated_per_s", None)
        budget_ms = solo.get("budget_ms")
        if budget_ms is None:  # no speed, no budget: its blocks would mean nothing
            self.say(f"  segment {seg.case}@{seg.stage} ({seg.task}): too few solo steps; skipped")
            with contextlib.suppress(Exception):
                self.session.detach(seg.task_id)
            return
        budgets = {seg.task_id: (budget_ms, solo.get("tight_budget_ms", budget_ms))}
        if seg.leftovers:
            beside = self._leftovers_segment(seg, budget_ms)
            rec["leftovers"] = beside
            if beside.get("budget_ms") is None:
                self.say(f"  segment {seg.case}@{seg.stage}: too few leftovers solo steps; skipped")
                for task_id in (seg.task_id, seg.leftovers_id):
                    with contextlib.suppress(Exception):
                        self.session.detach(task_id)
                return
            budgets[seg.leftovers_id] = (
                beside["budget_ms"],
                beside.get("tight_budget_ms", beside["budget_ms"]),
            )
        rec["first_checkpoint_s"] = took = self._first_checkpoints(budgets)
        self.say(f"  first checkpoints: {first_checkpoints_line(budgets, took)}")
        for task_id, (managed_ms, _) in budgets.items():
            self.session.tune(task_id, budget_ms=managed_ms)
        governor, trickler = (
            OverheadGovernor(
                target_frac=p.governor_target_frac, sm_min_pct=100, sm_max_pct=100, window=3,
                settle_steps=1, device_signals=p.governor_device_signals,
                evidence=p.governor_evidence,
            )
            for _ in range(2)
        )  # fmt: skip
        for task_id in budgets:
            governor.add_task(task_id)
        trickler.add_task(seg.task_id, trickle_duty=0.0)
        # Governed blocks start from the tight budget (no 10 ms rounding) and let the
        # governor widen it when training slows; managed blocks keep FreeRide's rule.
        governed_base_ms = {task_id: tight for task_id, (_, tight) in budgets.items()}
        held = {"governed": tuple(budgets), "trickle": (seg.task_id,)}  # what each loop governs
        loops = {
            mode: self.session.governor_loop(
                g, task_ids=held[mode],
                base_budget_s=lambda task_id: governed_base_ms[task_id] / 1e3,
                trickle=mode == "trickle",
            )
            for mode, g in (("governed", governor), ("trickle", trickler))
        }  # fmt: skip
        current = {task_id: (managed_ms, 0.0) for task_id, (managed_ms, _) in budgets.items()}
        for repeat, mode in bs.interleave(self.modes, p.repeats, closed=True):
            loop = loops.get(mode)
            governs = held[mode] if loop is not None else ()
            for task_id, (managed_ms, _) in budgets.items():
                want = (managed_ms, 0.0)
                if loop is not None and task_id in governs:
                    want = _limits_of(loop.governor, task_id, governed_base_ms[task_id])
                if want != current[task_id]:
                    self.session.tune(task_id, budget_ms=want[0], trickle_duty=want[1])
                    current[task_id] = want
            self._block(seg, repeat, mode, loop=loop)
            if loop is not None:
                for task_id in governs:
                    current[task_id] = _limits_of(loop.governor, task_id, governed_base_ms[task_id])
        _note_after(rec, self._solo(seg))  # the same after the blocks: did the speed move?
        if seg.leftovers:
            self._leftovers_solo_after(seg, rec["leftovers"], budget_ms)
        for task_id in (seg.task_id, seg.leftovers_id):
            if task_id:
                with contextlib.suppress(Exception):
                    self.session.detach(task_id)
        rec["elapsed_s"] = round(time.monotonic() - t0, 1)
        unit = f"{rec.get('unit', '')}/s"
        spread = rec.get("dedicated_spread_frac")
        flag = (
            f"; FLAGGED: before and after differ by {spread:.0%} (> {bs.SPREAD_FLAG_FRAC:.0%})"
            if rec.get("dedicated_unstable")
            else ""
        )
        self.say(
            f"  segment {seg.case}@{seg.stage} ({seg.task}) done in {rec['elapsed_s']} s; "
            f"dedicated {_g(rec['dedicated_before_per_s'])} {unit} before, "
            f"{_g(rec['dedicated_after_per_s'])} {unit} after{flag}"
        )

    def _first_checkpoints(self, task_ids: Iterable[str]) -> dict[str, float]:
        """Have each task save its state once before the blocks; the seconds each took.

        A task's first checkpoint pins host memory for its state's copies (VGG-19's 1.7 GB:
        0.7 s, its host taking no bubble and handing none on), which its later ones reuse
        (``sidetasks.host_copy`` [Note: host copies in pinned memory]). A task attached to a
        run pays that once; taken here, no measured block holds it.
        """
        took: dict[str, float] = {}
        for task_id in task_ids:
            t0 = time.monotonic()
            try:
                self.session.checkpoint(task_id)
            except (RuntimeError, ValueError, OSError) as exc:
                self.record["errors"].append(f"{task_id}: checkpoint before the blocks: {exc}")
                continue
            took[task_id] = round(time.monotonic() - t0, 3)
        return took

    def _leftovers_segment(self, seg: Segment, budget_ms: float) -> dict[str, Any]:
        """Attach the task that takes ``seg``'s leftovers and measure it alone, the segment's
        task parked (``_parked``); its segment record (``leftovers`` of the segment's)."""
        t0 = time.monotonic()
        self._ready(seg, self._attach(seg, leftovers=True))
        beside: dict[str, Any] = {"task": seg.leftovers, "task_id": seg.leftovers_id}
        beside["setup_s"] = round(time.monotonic() - t0, 1)
        with self._parked(seg, budget_ms):
            beside.update(self._solo(seg, leftovers=True))
        beside["dedicated_before_per_s"] = beside.pop("dedicated_per_s", None)
        return beside

    def _leftovers_solo_after(self, seg: Segment, beside: dict[str, Any], budget_ms: float) -> None:
        """The leftovers task alone once more, after the blocks (as the segment's task)."""
        with self._parked(seg, budget_ms):
            _note_after(beside, self._solo(seg, leftovers=True))

    @contextlib.contextmanager
    def _parked(self, seg: Segment, budget_ms: float) -> Iterator[None]:
        """The segment's task under a guard no bubble holds, so that it hands every bubble
        on whole to the task beside it (the open gate's too: ``_PARKED_MS`` outlasts it);
        ``budget_ms`` again after."""
        self.session.tune(seg.task_id, budget_ms=_PARKED_MS)
        try:
            yield
        finally:
            self.session.tune(seg.task_id, budget_ms=budget_ms)

    def _solo(self, seg: Segment, *, leftovers: bool = False) -> dict[str, Any]:
        """Hold training, let the task run alone, release: its dedicated speed and budget.

        The phase lasts at least ``solo_min_s`` and ``solo_steps`` measured steps (a
        fraction of a second measured speeds that moved by half between runs), at most
        ``solo_max_s``. ``leftovers``: the task beside the segment's (which the caller
        parks).
        """
        p = self.profile
        task, task_id = (seg.leftovers, seg.leftovers_id) if leftovers else (seg.task, seg.task_id)
        self._settle()
        seq = self._write_control(real_rank=seg.stage, gate=Gate.OPEN, hold=True)
        start_ns = self._wait_applied(seq)["t_ns"]
        path = self.run_dir / "events" / f"task-{task_id}.jsonl"
        t_min = time.monotonic() + p.solo_min_s
        t_end = time.monotonic() + p.solo_max_s
        while time.monotonic() < t_end:
            steps = task_steps(path, start_ns)[2:]
            # long enough, enough steps, and (for a task whose progress comes every few
            # steps, like the image task's bands) three completed units to measure whole cycles
            if (
                time.monotonic() >= t_min
                and len(steps) >= p.solo_steps
                and sum(float(e["progress"]) > 0 for e in steps) >= 3
            ):
                break
            time.sleep(_POLL_S)
        seq = self._write_control(real_rank=seg.stage, gate=Gate.CLOSED)
        end_ns = self._wait_applied(seq)["t_ns"]
        steps = [e for e in task_steps(path, start_ns) if e["start_ns"] < end_ns]
        out: dict[str, Any] = {"solo_steps": len(steps), "solo_s": (end_ns - start_ns) / 1e9}
        out.update(solo_figures(steps, p.governed_guard_factor, p.governed_guard_slack_ms))
        if len(steps) <= 2:
            self.record["errors"].append(f"{task}@{seg.stage}: only {len(steps)} solo steps")
        return out

    def _block(
        self,
        seg: Segment,
        repeat: int,
        mode: str,
        *,
        loop: GovernorLoop | None = None,
    ) -> None:
        """Switch to ``mode``, then wait out ``drop_steps`` + ``block_steps`` steps.

        The block's last period ends where step ``first + block_steps`` starts, under the next
        block's control; that is harmless unless the next control holds training, so
        ``_settle`` waits for that start first.
        """
        p = self.profile
        seq = self._write_control(
            real_rank=seg.stage, gate=_GATE_OF_MODE[mode], timed=mode != "plain"
        )
        first = self._wait_applied(seq)["step"] + p.drop_steps
        need = first + p.block_steps  # steps first .. first+block_steps-1 complete
        self._settled_at = need + 1  # ... and the start of the next one recorded
        if loop is not None:  # the session's governor, ticked here, over this block's steps
            loop.baseline_step_s = self._baseline_s(seg)
            loop.skip_to(first)
        timeout_s = 60.0 + 3 * (p.drop_steps + p.block_steps) * self.step_ms_estimate / 1e3

        def done() -> bool:
            if loop is not None:
                for rec in loop.tick():
                    rest = seg.leftovers_id and rec.get("task_id") == seg.leftovers_id
                    self.record["governor"].append(
                        {"stage": seg.stage, "mode": mode,
                         "task": bs.leftovers_key(seg.leftovers) if rest else seg.task,
                         "budget_ms": rec["budget_ms"], "trickle_duty": rec["trickle_duty"],
                         "reason": rec["reason"], "applied": rec["applied"]}
                    )  # fmt: skip
            return bool(self.session.steps_done >= need)

        self._wait(done, timeout_s, f"block {mode} of {seg.case}@{seg.stage}")
        self.blocks.append(
            {"order": len(self.blocks), "repeat": repeat, "mode": mode, "case": seg.case,
             "stage": seg.stage, "task": seg.task, "task_id": seg.task_id,
             "leftovers_task": seg.leftovers, "leftovers_task_id": seg.leftovers_id,
             "first_step": first, "steps": p.block_steps}
        )  # fmt: skip
        self._update_step_estimate()

    def _settle(self) -> None:
        """Wait until the last block's closing step start is on record (see ``_block``)."""
        need = self._settled_at
        self._wait(lambda: self.session.steps_done >= need, 120.0, "the last block to close")

    def _baseline_s(self, seg: Segment) -> float | None:
        """Median step time of this segment's vanilla blocks so far, as the governor measures
        it (``lab.governor.step_times_s``); None before any."""
        times = step_times_s(self.session.steps)
        found = [
            times[s]
            for b in self.blocks
            if b["task_id"] == seg.task_id and b["mode"] == "vanilla"
            for s in range(b["first_step"], b["first_step"] + b["steps"])
            if s in times
        ]
        return bs.median(found) if found else None

    def _time_steps(self) -> None:
        """Estimate the step time from this run's own first steps where no block has yet (a
        continuation whose instrumentation is measured starts with a task segment): the
        placeholder of a second a step made a 0.4 s GPU step's segment look 2.4 times as long,
        and the time budget skipped segments that would have fitted."""
        if self.blocks:
            return
        need = _TIMED_STEPS + 1
        self._wait(lambda: self.session.steps_done >= need, 120.0, "the first steps to time")
        self._update_step_estimate()

    def _update_step_estimate(self) -> None:
        steps = self.session.steps
        if len(steps) > 4:
            last = steps[steps["rank"] == 0].tail(6)["start_ms"].diff().dropna()
            if len(last):
                self.step_ms_estimate = float(last.median())

    # -- control --

    def _write_control(
        self, *, real_rank: int, gate: Gate, hold: bool = False, timed: bool = True
    ) -> int:
        self.seq += 1
        self.control.write(
            Control(seq=self.seq, real_rank=real_rank, gate=gate, hold=hold, timed=timed)
        )
        return self.seq

    def _wait_applied(self, seq: int) -> dict[str, int]:
        found: dict[str, int] = {}

        def applied() -> bool:
            for a in reversed(self.control.applied()):
                if a["seq"] == seq:
                    found.update(a)
                    return True
            return False

        self._wait(applied, 120.0, f"control #{seq} to take effect")
        return found

    def _wait(
        self,
        condition: Callable[[], bool],
        timeout_s: float,
        what: str,
        *,
        fail_on: Callable[[], bool] | None = None,
        poll_s: float = _POLL_S,
    ) -> None:
        deadline = min(time.monotonic() + timeout_s, self.hard_deadline)
        while not condition():
            state = self.session.state
            if state.done:
                raise RuntimeError(
                    f"the run ended ({state}) while waiting for {what}: {self.session.failure}"
                )
            if fail_on is not None and fail_on():
                raise RuntimeError(f"gave up waiting for {what}: it failed or stopped")
            if time.monotonic() >= deadline:
                if deadline == self.hard_deadline:
                    raise TimeoutError(f"the time budget ran out while waiting for {what}")
                raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
            time.sleep(poll_s)

    # -- reports --

    def _collect(self) -> list[dict[str, Any]]:
        """The blocks table of this run, from its event files (``bench.readout``)."""
        samples = list(self.sampler.samples()) if self.sampler is not None else []
        return collect_blocks(
            self.run_dir, self.config(), self.plan.name, self.blocks, self.record, samples
        )


def solo_figures(
    steps: Sequence[Mapping[str, Any]], guard_factor: float = 1.1, guard_slack_ms: float = 0.5
) -> dict[str, Any]:
    """What a task's solo phase gives, from its ``side_task_step`` records (the first two left
    out): its unit, its dedicated speed, and the time of one ``step()`` call (median and p95)
    with the two guards made from it, FreeRide's (``budget_ms``: the median rounded up to
    10 ms x 1.2) and the tight one governed blocks start from (``tight_budget_ms``: the p95 x
    ``guard_factor`` + ``guard_slack_ms``). Empty figures for two records or fewer.

    A record of a group covers several calls (``SideTaskStep.calls``; ``sidetasks.host.
    iterative`` [Note: step groups]); the host guards each call and profiles one call's time,
    so the guards here are a call's too. Made from a record's time instead, PageRank's tight
    guard was a 1 ms group's, 1.7 ms, against its 0.15 ms calls, and every group in a bubble
    stopped that far before the bubble's predicted end.

        >>> group = {"start_ns": 0, "end_ns": 1_050_000, "progress": 7.0, "calls": 7}
        >>> f = solo_figures([group] * 5)
        >>> round(f["solo_step_ms_p95"], 3), round(f["tight_budget_ms"], 3), f["budget_ms"]
        (0.15, 0.665, 12.0)
        >>> old = {"start_ns": 0, "end_ns": 1_050_000, "progress": 7.0}  # a record without calls
        >>> round(solo_figures([old] * 5)["tight_budget_ms"], 3)
        1.655
    """
    out: dict[str, Any] = {"unit": steps[0].get("unit", "") if steps else ""}
    if len(steps) <= 2:
        return out
    progress = [float(e["progress"]) for e in steps]
    durations = [(e["end_ns"] - e["start_ns"]) / 1e6 for e in steps]
    calls = [step_calls(e) for e in steps]
    call_ms = [d / n for d, n in zip(durations, calls, strict=True)][2:]
    out["dedicated_per_s"] = bs.dedicated_throughput_per_s(progress, durations, skip=2)
    out["solo_step_ms_median"] = bs.median(call_ms)
    out["budget_ms"] = step_budget_s(out["solo_step_ms_median"] / 1e3) * 1e3
    out["solo_step_ms_p95"] = bs.percentile(call_ms, 95)
    out["solo_calls_per_record"] = bs.median(calls[2:])
    out["tight_budget_ms"] = 1e3 * tight_step_budget_s(
        out["solo_step_ms_p95"] / 1e3, factor=guard_factor, slack_s=guard_slack_ms / 1e3
    )
    return out


def _note_after(rec: dict[str, Any], after: dict[str, Any]) -> None:
    """Put a task's solo phase after the blocks beside the one before them in its segment
    record ``rec``, and the speed harvest uses (``bench.stats.dedicated_speed``)."""
    rec.update(
        solo_after_steps=after["solo_steps"],
        solo_after_s=after["solo_s"],
        dedicated_after_per_s=after.get("dedicated_per_s"),
    )
    rec.update(bs.dedicated_speed(rec["dedicated_before_per_s"], rec["dedicated_after_per_s"]))


def _limits_of(governor: OverheadGovernor, task_id: str, base_ms: float) -> tuple[float, float]:
    """(budget in ms, trickle duty) that ``governor`` holds ``task_id`` at."""
    return base_ms * governor.limits(task_id)[1], governor.trickle_duty(task_id) or 0.0


def _g(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.4g}"


def first_checkpoints_line(task_ids: Iterable[str], took: Mapping[str, float]) -> str:
    """The log's word on each task's checkpoint before the blocks: its seconds, or that it
    failed (the reason is in the result's errors).

        >>> first_checkpoints_line(["t1", "t2"], {"t1": 0.714})
        't1 0.714 s, t2 failed (see the errors)'
    """
    return (
        ", ".join(
            f"{t} {took[t]:g} s" if t in took else f"{t} failed (see the errors)" for t in task_ids
        )
        or "no task"
    )
