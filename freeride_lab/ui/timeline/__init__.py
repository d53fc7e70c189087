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

from freeride_lab.core.lazy_names import lazy_getattr

# [Note: a light timeline package]
# The dashboard's launch path needs only the pump's constants; the figures import plotly and
# pandas (seconds in a cold kernel). So the names are loaded on first use (PEP 562), by the
# module that defines them, and ``import freeride_lab.ui.timeline.pump`` stays light.
_WHERE = {
    "FRACTION_COLUMNS": "figures",
    "fractions_figure": "figures",
    "timeline_figure": "figures",
    "MIN_INTERVAL_S": "pump",
    "TimelinePump": "pump",
    "TimelineTables": "pump",
    "fingerprint": "pump",
    "session_tables": "pump",
    "BUBBLE": "style",
    "COMPUTE": "style",
    "OKABE_ITO": "style",
    "OVERRUN": "style",
    "Category": "style",
    "Theme": "style",
    "figure_theme": "style",
    "SIDE_TASK_COLUMNS": "traces",
    "BarTrace": "traces",
    "safe_text": "traces",
    "side_task_names": "traces",
    "steps_in_window": "traces",
    "timeline_traces": "traces",
    "Timeline": "widget",
}


__getattr__ = lazy_getattr(__name__, {k: f"{__name__}.{m}" for k, m in _WHERE.items()}, globals())


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


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
