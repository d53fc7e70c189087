"""Hand-made rows as the tables the timeline and the report draw: actions (without the raw
``*_ns`` columns, which neither draws), bubbles and side-task steps."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from freeride_lab.core.bubbles import BUBBLE_COLUMNS
from freeride_lab.lab import frames

ACTION_COLUMNS = [c for c in frames.ACTION_COLUMNS if not c.endswith("_ns")]


def drawn_tables(
    actions: Sequence[tuple], bubbles: Sequence[tuple], side_task_steps: Sequence[tuple]
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The actions, bubbles and side-task steps frames of these rows, in table order."""
    return (
        pd.DataFrame(actions, columns=ACTION_COLUMNS),
        pd.DataFrame(bubbles, columns=list(BUBBLE_COLUMNS)),
        pd.DataFrame(side_task_steps, columns=list(frames.SIDE_TASK_STEP_COLUMNS)),
    )
