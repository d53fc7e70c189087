"""A run's bubbles, read with the run's own shape: ``core.bubbles.extract_bubbles`` and
``core.attribution.attribute_bubbles`` given the schedule, stages, microbatches and chunks of
its ``RunConfig``. ``Session`` and the dashboard both read bubbles through these, so the
table and the chart split the same gaps the same way.

    bubbles = run_bubbles(cfg, session.actions, session.steps, min_ms=0.5)
    attributed = attributed_bubbles(cfg, session.actions, bubbles, session.steps)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from freeride_lab.core import attribution as core_attribution
from freeride_lab.core import bubbles as core_bubbles

if TYPE_CHECKING:
    import pandas as pd

    from freeride_lab.core.config import RunConfig

__all__ = ["attributed_bubbles", "bubble_summary", "run_bubbles"]


def run_bubbles(
    config: RunConfig, actions: pd.DataFrame, steps: pd.DataFrame, *, min_ms: float
) -> pd.DataFrame:
    """Idle gaps per (step, rank) of ``actions``: the windows' gaps and, between steps,
    boundary gaps (``steps`` holds the optimizer spans, which count as busy)."""
    return core_bubbles.extract_bubbles(
        actions,
        steps=steps,
        schedule=config.schedule,
        stages=config.stages,
        microbatches=config.microbatches,
        chunks=config.chunks,
        min_ms=min_ms,
    )


def attributed_bubbles(
    config: RunConfig, actions: pd.DataFrame, bubbles: pd.DataFrame, steps: pd.DataFrame
) -> pd.DataFrame:
    """``bubbles`` with each split into why it is there: ``schedule_ms``, ``peer_ms`` and
    ``host_ms`` (see ``core.attribution``)."""
    return core_attribution.attribute_bubbles(
        actions,
        bubbles,
        steps=steps,
        schedule=config.schedule,
        stages=config.stages,
        microbatches=config.microbatches,
        chunks=config.chunks,
    )


def bubble_summary(
    config: RunConfig, actions: pd.DataFrame, *, skip_steps: int, min_ms: float
) -> pd.DataFrame:
    """Measured vs theory bubble fraction per rank (``core.bubbles.summary``), leaving out
    the first ``skip_steps`` steps as warm-up."""
    return core_bubbles.summary(
        actions,
        config.schedule,
        config.stages,
        config.microbatches,
        config.chunks,
        skip_steps=skip_steps,
        min_ms=min_ms,
    )
