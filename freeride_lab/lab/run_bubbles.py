"""A run's bubbles, read with the run's own shape: ``core.bubbles`` and ``core.attribution``
given the schedule, stages, microbatches and chunks of its ``RunConfig``. ``Session`` and the
dashboard both read bubbles through these, so the table and the chart split the same gaps the
same way.

    bubbles = run_bubbles(cfg, session.actions, session.steps, min_ms=0.5)
    attributed = attributed_bubbles(cfg, session.actions, bubbles, session.steps)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from freeride_lab.core import attribution as core_attribution
from freeride_lab.core import bubbles as core_bubbles

if TYPE_CHECKING:
    import pandas as pd

    from freeride_lab.core.config import RunConfig

__all__ = ["RunShape", "attributed_bubbles", "bubble_summary", "run_bubbles", "run_shape"]


class RunShape(TypedDict):
    """What the bubble rules need to know of a run's plan (keyword arguments of theirs)."""

    schedule: str
    stages: int
    microbatches: int
    chunks: int | None


def run_shape(config: RunConfig) -> RunShape:
    """The shape of ``config``'s run: schedule, stages, microbatches and chunks."""
    return RunShape(
        schedule=config.schedule,
        stages=config.stages,
        microbatches=config.microbatches,
        chunks=config.chunks,
    )


def run_bubbles(
    config: RunConfig, actions: pd.DataFrame, steps: pd.DataFrame, *, min_ms: float
) -> pd.DataFrame:
    """Idle gaps per (step, rank) of ``actions``: the windows' gaps and, between steps,
    boundary gaps (``steps`` holds the optimizer spans, which count as busy)."""
    return core_bubbles.extract_bubbles(actions, steps=steps, min_ms=min_ms, **run_shape(config))


def attributed_bubbles(
    config: RunConfig, actions: pd.DataFrame, bubbles: pd.DataFrame, steps: pd.DataFrame
) -> pd.DataFrame:
    """``bubbles`` with each split into why it is there: ``schedule_ms``, ``peer_ms`` and
    ``host_ms`` (see ``core.attribution``)."""
    return core_attribution.attribute_bubbles(actions, bubbles, steps=steps, **run_shape(config))


def bubble_summary(
    config: RunConfig, actions: pd.DataFrame, *, skip_steps: int, min_ms: float
) -> pd.DataFrame:
    """Measured vs theory bubble fraction per rank (``core.bubbles.summary``), leaving out
    the first ``skip_steps`` steps as warm-up."""
    return core_bubbles.summary(actions, skip_steps=skip_steps, min_ms=min_ms, **run_shape(config))
