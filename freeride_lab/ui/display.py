"""The notebook's view of a ``Session``: registered with IPython's display formatters.

``lab`` never imports ``ui`` (``lab.session`` [Note: upward hooks]), so a Session has no
``_repr_mimebundle_`` of its own; ``%load_ext freeride_lab`` registers ``session_mimebundle``
for it by name (the Session's module is not imported for that), and ``%unload_ext`` removes
it. Importing ``freeride_lab`` inside IPython registers it too, so a notebook that only does
``Session.launch(...)`` still shows the dashboard. Displaying a Session then shows its live
dashboard (``ui.dashboard.mimebundle``).

    register_display(get_ipython())      # what loading the extension does
    session                              # → text/plain, text/html summary, dashboard widget
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["SESSION_TYPE", "register_display", "session_mimebundle", "unregister_display"]

#: The class displayed, as (module, name): IPython looks it up by name, so loading the
#: extension does not import the lab.
SESSION_TYPE = ("freeride_lab.lab.session", "Session")


def session_mimebundle(
    session: Any, include: Sequence[str] | None = None, exclude: Sequence[str] | None = None
) -> dict[str, Any] | None:
    """A Session's mime bundle: its dashboard (``ui.dashboard.mimebundle``); None, so that
    IPython shows its plain repr, where the dashboard's packages are missing."""
    try:
        from freeride_lab.ui.dashboard import mimebundle
    except ImportError:
        return None
    bundle: dict[str, Any] = mimebundle(session, include, exclude)
    return bundle


def register_display(ipython: Any) -> None:
    """Show Sessions as their dashboard in ``ipython`` (idempotent)."""
    formatter = _formatter(ipython)
    if formatter is not None:
        formatter.for_type_by_name(*SESSION_TYPE, session_mimebundle)


def unregister_display(ipython: Any) -> None:
    """Undo ``register_display`` (nothing happens if it was not registered)."""
    formatter = _formatter(ipython)
    if formatter is not None:
        formatter.pop(".".join(SESSION_TYPE), None)


def _formatter(ipython: Any) -> Any:
    display_formatter = getattr(ipython, "display_formatter", None)
    return getattr(display_formatter, "mimebundle_formatter", None)
