"""The lab: ``Session`` (owns a run: launch, re-open, stop) and the tables it reads.

Headless: nothing here draws. Importing is cheap; names load on first use.
"""

from __future__ import annotations

from freeride_lab.core.lazy_names import lazy_getattr

_LAZY = {
    "Session": "freeride_lab.lab.session",
    "RunFailure": "freeride_lab.lab.session",
    "check_environment": "freeride_lab.lab.preflight",
    "EventTables": "freeride_lab.lab.tables",
    "EventTailer": "freeride_lab.lab.tailer",
    "read_events": "freeride_lab.lab.tailer",
}

__all__ = list(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY, globals())
