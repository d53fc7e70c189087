"""What every view of a session reads: its run id, its config and its event tables.

``freeride_lab.lab.session.Session`` has them, and so does any stand-in a view is shown
(a test's fake session); the report and the dashboard each add what else they read.

Typing only: importing this module loads nothing else (pandas comes with the first tables).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SessionView"]


class SessionView(Protocol):
    """The part of ``freeride_lab.lab.session.Session`` that every view reads."""

    run_id: str
    config: Any  # RunConfig

    @property
    def actions(self) -> pd.DataFrame: ...
    @property
    def steps(self) -> pd.DataFrame: ...
    @property
    def side_task_steps(self) -> pd.DataFrame: ...
