"""Which fields of each event kind a table keeps, and how: the one list that the compact store
(``lab.tables.EventTables``) and the pure frames (``lab.frames``) share. Plain data, no imports
beyond typing, so the store costs nothing at launch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ACTION_RAW", "MEMORY_RAW", "RAW_BY_KIND", "SIDE_TASK_STEP_RAW", "STEP_RAW", "Event"]

Event = dict[str, Any]  # one decoded JSON line; ``kind`` names its type (core.events)

# What ``EventTables`` keeps of each event a table is built from, column by column: "i" an
# integer, "z" an integer that is 0 when missing, "f" a float (NaN when missing or not a
# number), "s" a string (or None). The pure ``*_frame`` functions pick the same columns.
ACTION_RAW: dict[str, str] = {
    "step": "i",
    "rank": "i",
    "stage": "i",
    "action": "s",
    "microbatch": "i",
    "start_ns": "i",
    "end_ns": "i",
}
STEP_RAW: dict[str, str] = {
    "step": "i",
    "rank": "i",
    "start_ns": "i",
    "end_ns": "i",
    "optimizer_start_ns": "i",
    "optimizer_end_ns": "i",
    "loss": "f",
    "tokens": "z",
}
MEMORY_RAW: dict[str, str] = {
    "step": "i",
    "rank": "i",
    "device": "s",
    "peak_reserved_bytes": "i",
    "capacity_bytes": "z",
}
SIDE_TASK_STEP_RAW: dict[str, str] = {
    "task_id": "s",
    "name": "s",
    "stage": "i",
    "rank": "i",
    "step": "i",
    "start_ns": "i",
    "end_ns": "i",
    "progress": "f",
    "unit": "s",
    "overrun_ns": "z",
    "seen_ns": "z",
    "expected_ns": "z",
    "spin_from_ns": "z",
    "spin_until_ns": "z",
    "guard_ns": "z",
}

#: The raw columns of each table, by the ``kind`` of the events it is built from.
RAW_BY_KIND: dict[str, dict[str, str]] = {
    "action": ACTION_RAW,
    "step": STEP_RAW,
    "memory": MEMORY_RAW,
    "side_task_step": SIDE_TASK_STEP_RAW,
}
