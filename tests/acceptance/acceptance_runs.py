"""Real sleep-timed runs shared by the acceptance tests, launched a few at a time.

A ``RunFarm`` launches each requested ``Shape`` once per test session through ``Session.launch``
(torchrun, gloo, one process per rank) and keeps the finished session, so a run that two test
files need (the 1F1B S=4, M=8 run is in the fraction and planner tests) is paid for once.

Why these numbers:
- Stage costs are sleeps of ``T_MS`` per micro-batch per rank (split over a rank's chunks), so
  they do not depend on how busy the two cores are; what does is Python dispatch between
  actions (about 1 ms) and, on a box shared with other work, a process now and then descheduled
  for tens of ms. At 100 ms that noise stays a small share of every bubble; at 20 ms
  Interleaved1F1B at S=2 measured 5.7 points above theory, and at 60 ms under a load average of
  8 the planner comparison missed by 6% and a 60 ms cool-down gap shrank below 15 ms. Start-up
  (a torch import per rank, 10-40 s) dominates a run's time anyway.
- Four steps with step 0 (allocation, first-call overheads) left out of every measurement.
- ``CONCURRENCY`` runs start together: their torch imports overlap with each other rather than
  with another run's measured steps, and the whole farm takes about a third of the serial time.
- Each test module lists its shapes in a module-level ``RUNS``; the farm learns every selected
  module's ``RUNS`` at the start (``planned``) and runs them all in full batches on the first
  request, so a file run alone launches only its own shapes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import pandas as pd
from runs import log_tails, synthetic_config

from freeride_lab.core.config import RunConfig
from freeride_lab.lab.session import Session
from freeride_lab.pipeline.launcher import RunState

T_MS = 100.0  # synthetic F, I and W cost per micro-batch per rank
STEPS = 4
SKIP_STEPS = 1  # warm-up step left out of every measurement
CONCURRENCY = 3
RUN_TIMEOUT_S = 300.0  # one batch on a loaded two-core box (a torch import per rank)


@dataclass(frozen=True)
class Shape:
    """A run of the synthetic workload: schedule, pipeline ranks S, micro-batches M, cost."""

    schedule: str
    stages: int
    microbatches: int
    t_ms: float = T_MS

    def config(self) -> RunConfig:
        return synthetic_config(
            steps=STEPS,
            stages=self.stages,
            microbatches=self.microbatches,
            phase_ms=self.t_ms,
            schedule=self.schedule,
        )

    def __str__(self) -> str:
        return f"{self.schedule}-S{self.stages}-M{self.microbatches}"


R = TypeVar("R")  # what was run: a ``Shape`` here, a ``GatedRun`` in ``gated_runs``


@dataclass(frozen=True)
class FinishedRun(Generic[R]):
    """A run that ended, with its tables read once."""

    run: R
    session: Session
    state: RunState
    actions: pd.DataFrame  # every step, as Session.actions
    skip_steps: int = SKIP_STEPS  # warm-up steps left out of ``measured``

    @property
    def measured(self) -> pd.DataFrame:
        """Actions of the steps after the warm-up."""
        return self.actions[self.actions["step"] >= self.skip_steps]

    def explain(self) -> str:
        """The run's state, failure and log tails, for assertion messages."""
        return f"{self.run}: {self.state} ({self.session.failure})\n{log_tails(self.session)}"


def finished(runs: Mapping[R, FinishedRun[R]], run: R) -> FinishedRun[R]:
    """The finished run of ``run``; fails with its state and log tails if it did not finish."""
    result = runs[run]
    assert result.state == RunState.FINISHED, result.explain()
    return result


class RunFarm:
    """Launches shapes in batches of ``CONCURRENCY`` and remembers every finished run."""

    def __init__(self, root: Path, planned: Iterable[Shape] = ()) -> None:
        self.root = root
        self.planned = list(dict.fromkeys(planned))
        self._done: dict[Shape, FinishedRun[Shape]] = {}

    def get(self, shapes: Iterable[Shape]) -> dict[Shape, FinishedRun[Shape]]:
        """The finished run of each shape, launching those not run yet (and every planned one)."""
        wanted = list(dict.fromkeys(shapes))
        missing = [s for s in dict.fromkeys([*wanted, *self.planned]) if s not in self._done]
        for i in range(0, len(missing), CONCURRENCY):
            self._run_batch(missing[i : i + CONCURRENCY])
        return {s: self._done[s] for s in wanted}

    def _run_batch(self, batch: list[Shape]) -> None:
        sessions: list[tuple[Shape, Session]] = []
        try:
            for shape in batch:
                run_dir = self.root / str(shape)
                sessions.append((shape, Session.launch(shape.config(), run_dir=run_dir, grace_s=3)))
            for shape, session in sessions:
                state = session.wait(timeout_s=RUN_TIMEOUT_S)
                self._done[shape] = FinishedRun(shape, session, state, session.actions)
        finally:
            for _, session in sessions:
                session.stop()  # a no-op for a finished run; ends the batch on a timeout

    def stop(self) -> None:
        for run in self._done.values():
            run.session.stop()
