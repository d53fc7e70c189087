"""Real sleep-timed runs measured side by side, with a start gate (``start_gate.py``).

A ``GatedFarm`` launches a batch of runs at once (``Session.launch``: torchrun, gloo, one
process per rank, no side-task workers) and holds every rank at the gate until all ranks of the
batch have imported torch and joined their process groups; then all of them train together.
So no run's measured steps share the two cores with another run's start-up (tens of seconds of
imports), while the start-ups themselves overlap, which is what keeps a dozen runs to about a
minute. Runs of one ``group`` share a batch (up to ``MAX_RANKS`` ranks); groups with different
timing needs (long actions for bubble fractions, short ones for the planner) run apart. A run's
``train_ranks`` bounds how many ranks of its batch train at once: the farm opens the gate run by
run (most ranks first), the others waiting at it, asleep, until enough of the batch has ended,
so runs that must not crowd the two cores still pay for their start-ups together.

Each test module lists its runs in a module-level ``GATED_RUNS``; the farm learns every selected
module's runs at the start (as ``RunFarm`` does) and launches them on the first request.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path

from acceptance_runs import FinishedRun
from runs import synthetic_config
from start_gate import GATE, go_file, ready_file, run_go_file

from freeride_lab.core.config import CostMs, RunConfig, RuntimeOptions
from freeride_lab.lab.session import Session

HERE = Path(__file__).resolve().parent
MAX_RANKS = 20  # ranks per batch: 20 torch imports on two cores take about a minute
RUN_TIMEOUT_S = 420.0  # a batch's start-up plus its steps on a loaded two-core box


@dataclass(frozen=True)
class GatedRun:
    """A synthetic run: shape and per-stage-chunk costs (see ``RunConfig``)."""

    schedule: str
    stages: int
    microbatches: int
    chunks: int
    t_forward_ms: CostMs
    t_backward_input_ms: CostMs
    t_backward_weight_ms: CostMs
    steps: int
    group: str
    skip_steps: int = 1
    label: str = field(default="", compare=True)
    train_ranks: int = MAX_RANKS  # at most this many ranks of its batch train at once

    def config(self) -> RunConfig:
        """Its fields that ``RunConfig`` has too, on the small synthetic model, without side-task
        workers, each rank waiting at the start gate."""
        shared = {f.name for f in fields(RunConfig)}
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name in shared}
        return synthetic_config(**own, side_tasks=False, runtime=RuntimeOptions(edges_factory=GATE))

    def __str__(self) -> str:
        tail = f"-{self.label}" if self.label else ""
        return f"{self.schedule}-S{self.stages}-M{self.microbatches}-V{self.chunks}{tail}"


#: A gated run that ended, with its tables read once (``measured`` skips its ``skip_steps``).
GatedResult = FinishedRun[GatedRun]


class GatedFarm:
    """Launches ``GatedRun`` batches behind one start gate each and remembers the results."""

    def __init__(self, root: Path, planned: Iterable[GatedRun] = ()) -> None:
        self.root = root
        self.planned = list(dict.fromkeys(planned))
        self._done: dict[GatedRun, GatedResult] = {}
        self._batches = 0

    def get(self, runs: Iterable[GatedRun]) -> dict[GatedRun, GatedResult]:
        """The result of each run, launching those not run yet (and every planned one)."""
        wanted = list(dict.fromkeys(runs))
        missing = [r for r in dict.fromkeys([*wanted, *self.planned]) if r not in self._done]
        for group in dict.fromkeys(r.group for r in missing):
            batch: list[GatedRun] = []
            for run in (r for r in missing if r.group == group):
                if batch and sum(r.stages for r in batch) + run.stages > MAX_RANKS:
                    self._run_batch(batch)
                    batch = []
                batch.append(run)
            if batch:
                self._run_batch(batch)
        return {r: self._done[r] for r in wanted}

    def _run_batch(self, batch: list[GatedRun]) -> None:
        self._batches += 1
        root = self.root / f"batch{self._batches}"
        root.mkdir(parents=True)
        path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
        previous = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = path  # the ranks import start_gate
        sessions: list[tuple[GatedRun, Session]] = []
        try:
            for run in batch:
                session = Session.launch(run.config(), run_dir=root / str(run), grace_s=3)
                sessions.append((run, session))
            self._wait_ready(root, sessions)
            self._train(root, sessions)
            for run, session in sessions:
                state = session.wait(timeout_s=RUN_TIMEOUT_S)
                self._done[run] = GatedResult(run, session, state, session.actions, run.skip_steps)
        finally:
            if previous is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = previous
            go_file(root).touch()
            for _, session in sessions:
                session.stop()  # a no-op for a finished run; ends the batch on a timeout

    @staticmethod
    def _wait_ready(root: Path, sessions: list[tuple[GatedRun, Session]]) -> None:
        """Until every rank waits at the gate (or a run has ended: it never will)."""
        ready = [ready_file(root, str(run), r) for run, _ in sessions for r in range(run.stages)]
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not all(p.exists() for p in ready) and time.monotonic() < deadline:
            if any(s.state.done for _, s in sessions):
                return
            time.sleep(0.05)

    @staticmethod
    def _train(root: Path, sessions: list[tuple[GatedRun, Session]]) -> None:
        """Open the gate run by run, the longest (most ranks) first, so that at most the
        smallest ``train_ranks`` of the batch train at once (one run at least); a run counts as
        training until it ends or ``RUN_TIMEOUT_S`` after its gate opened."""
        limit = min(run.train_ranks for run, _ in sessions)
        waiting = sorted(sessions, key=lambda rs: -rs[0].stages)
        training: list[tuple[GatedRun, Session, float]] = []
        while waiting:
            now = time.monotonic()
            training = [t for t in training if not t[1].state.done and now - t[2] < RUN_TIMEOUT_S]
            busy = sum(run.stages for run, _, _ in training)
            fits = [rs for rs in waiting if not training or busy + rs[0].stages <= limit]
            if not fits:
                time.sleep(0.05)
                continue
            run, session = fits[0]
            waiting.remove(fits[0])
            run_go_file(root, str(run)).touch()
            training.append((run, session, now))

    def stop(self) -> None:
        for result in self._done.values():
            result.session.stop()
