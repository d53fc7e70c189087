"""The lab: ``Session`` (owns a run: launch, re-open, stop) and the tables it reads.

Headless: nothing here draws. Importing is cheap; names load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Session": "freeride_lab.lab.session",
    "RunFailure": "freeride_lab.lab.session",
    "check_environment": "freeride_lab.lab.preflight",
    "EventTables": "freeride_lab.lab.tables",
    "EventTailer": "freeride_lab.lab.tailer",
    "read_events": "freeride_lab.lab.tailer",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'freeride_lab.lab' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
