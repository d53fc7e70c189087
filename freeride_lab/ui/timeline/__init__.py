"""Pipeline timeline: one lane per rank, one horizontal-bar trace per category, live or static.

    tl = Timeline(window_steps=3)
    tl.update(session.actions, session.attribution, summary=session.summary())
    tl                                                 # displays figure + bubble fractions
    pump = TimelinePump(lambda: session_tables(session), tl).start()

Bars are ``go.Bar(orientation="h", base=start_ms, x=duration_ms)`` with float64 numpy arrays
(plotly sends those as binary buffers; int64 would go as JSON). Plotly's validator for ``base``
accepts any type and stores it as an object array, so ``base`` travels as a JSON list while
``x`` and ``y`` stay binary. Each category — compute kinds F/B/I/W, bubbles, each side task,
overruns — is one trace, so a redraw is one ``batch_update`` that swaps arrays, never
thousands of shapes. Only a bounded window is drawn: the last ``window_steps`` steps, or one
selected step. A bubble's hover shows why it is there (schedule, peer and host ms) when the
bubbles table carries ``core.attribution``'s parts, as ``Session.attribution`` does.

The package by job: ``style`` (colour-blind-safe colours, patterns, light/dark templates),
``traces`` (tables → arrays), ``figures`` (arrays → Plotly figures), ``widget`` (the live
:class:`Timeline`), ``pump`` (a polling thread).
"""

from __future__ import annotations

from freeride_lab.ui.timeline.figures import (
    FRACTION_COLUMNS,
    fractions_figure,
    timeline_figure,
)
from freeride_lab.ui.timeline.pump import (
    MIN_INTERVAL_S,
    TimelinePump,
    TimelineTables,
    fingerprint,
    session_tables,
)
from freeride_lab.ui.timeline.style import (
    BUBBLE,
    COMPUTE,
    OKABE_ITO,
    OVERRUN,
    Category,
    Theme,
    figure_theme,
)
from freeride_lab.ui.timeline.traces import (
    SIDE_TASK_COLUMNS,
    BarTrace,
    safe_text,
    side_task_names,
    steps_in_window,
    timeline_traces,
)
from freeride_lab.ui.timeline.widget import Timeline

__all__ = [
    "BUBBLE",
    "COMPUTE",
    "FRACTION_COLUMNS",
    "MIN_INTERVAL_S",
    "OKABE_ITO",
    "OVERRUN",
    "SIDE_TASK_COLUMNS",
    "BarTrace",
    "Category",
    "Theme",
    "Timeline",
    "TimelinePump",
    "TimelineTables",
    "figure_theme",
    "fingerprint",
    "fractions_figure",
    "safe_text",
    "session_tables",
    "side_task_names",
    "steps_in_window",
    "timeline_figure",
    "timeline_traces",
]
