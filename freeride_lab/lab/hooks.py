"""What the layers above ``lab`` plug into it: how a Session becomes a report.

``lab`` never imports ``ui`` (see ``lab.session`` [Note: upward hooks]). ``Session.report``
asks ``report_writer()`` for the writer that a higher layer registered with
``set_report_writer``; importing ``freeride_lab`` registers the report of ``freeride_lab.ui``,
loaded when the first report is written.

    set_report_writer(lambda session, path: write_session_report(session, path))
    report_writer()(session, "report.html")
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["REPORT_EXTRA", "ReportWriter", "report_writer", "set_report_writer"]

#: Writes a session's report to a path and returns the path written.
ReportWriter = Callable[[Any, "str | Path"], Path]

#: The extra that installs the report's packages.
REPORT_EXTRA = "freeride-lab[ui]"

_report_writer: ReportWriter | None = None


def set_report_writer(writer: ReportWriter | None) -> None:
    """Register how ``Session.report`` writes a report (None removes it)."""
    global _report_writer
    if writer is not None and not callable(writer):
        raise TypeError(f"writer={writer!r} must be callable as writer(session, path) -> Path")
    _report_writer = writer


def report_writer() -> ReportWriter:
    """The registered report writer.

    Raises:
        ImportError: none is registered (only ``freeride_lab.lab`` was loaded, without the
            package that writes reports); the message names the extra to install.
    """
    if _report_writer is None:
        raise ImportError(
            "Session.report needs freeride_lab's report (freeride_lab.ui) and its packages, and "
            f"none is registered here; install them with pip install '{REPORT_EXTRA}'"
        )
    return _report_writer
