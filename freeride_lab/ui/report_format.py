"""Numbers and column names of a run's report, written for people.

A report's tables hold display strings: ``7`` rather than ``7.000``, ``31.2`` in a column
headed ``measured (%)`` rather than ``0.312``, and the unit moves from the value into the
header (``bubble_ms_per_step`` → ``bubble per step (ms)``).

    >>> number(7.0), number(0.31234), number(1234.5), number(float("nan"))
    ('7', '0.31', '1,234', '—')
    >>> header("bubble_ms_per_step"), header("measured_frac"), header("throughput_per_s")
    ('bubble per step (ms)', 'measured (%)', 'throughput (per s)')
    >>> cell("measured_frac", 0.3125), percent(0.0812)
    ('31.2', '8.12%')
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

__all__ = [
    "Table",
    "cell",
    "header",
    "jsonable",
    "number",
    "pairs",
    "percent",
    "scalar",
    "table",
]

DASH = "—"

#: Column-name endings and the unit they put into the header, longest first.
_UNITS: tuple[tuple[str, str, str], ...] = (
    ("_ms_per_step", " per step", "ms"),
    ("_ms_total", " total", "ms"),
    ("_per_s", "", "per s"),
    ("_frac", "", "%"),
    ("_bytes", "", "bytes"),
    ("_pct", "", "%"),
    ("_ms", "", "ms"),
    ("_s", "", "s"),
)


@dataclass(frozen=True)
class Table:
    """Rows of display strings for the template (escaped there)."""

    columns: list[str]
    rows: list[list[str]]


def scalar(value: Any) -> Any:
    """A numpy scalar as the Python value (strings unchanged)."""
    return value.item() if hasattr(value, "item") and not isinstance(value, str) else value


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def number(value: Any) -> str:
    """A number as people read it: whole numbers without decimals, three significant digits
    below 100, thousands separated; NaN and None as a dash."""
    value = scalar(value)
    if _missing(value):
        return DASH
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float) and math.isinf(value):
        return "∞" if value > 0 else "-∞"
    if float(value).is_integer() or abs(value) >= 100:
        return f"{value:,.0f}"
    text = f"{value:.3g}" if abs(value) >= 1 else f"{value:.2g}"
    return text if "e" in text else (text.rstrip("0").rstrip(".") if "." in text else text)


def percent(value: Any, *, sign: bool = False) -> str:
    """A fraction (0-1) as a percentage with three significant digits: ``8.12%``."""
    value = scalar(value)
    if _missing(value):
        return DASH
    text = number(100.0 * float(value))
    return f"+{text}%" if sign and float(value) > 0 else f"{text}%"


def header(column: str) -> str:
    """A column name with its unit in parentheses, words spaced."""
    for suffix, words, unit in _UNITS:
        if column.endswith(suffix) and len(column) > len(suffix):
            return f"{column[: -len(suffix)].replace('_', ' ')}{words} ({unit})"
    return column.replace("_", " ")


def cell(column: str, value: Any) -> str:
    """One table cell: fractions as percentage numbers (the header says %), others as
    :func:`number`, containers as JSON."""
    value = scalar(value)
    if _missing(value):
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        if column.endswith("_frac"):
            return number(100.0 * value)
        return number(value)
    if isinstance(value, dict | list | tuple):
        return json.dumps(jsonable(value))
    return str(value)


def table(frame: pd.DataFrame) -> Table:
    """A frame as display strings, headers with their units."""
    columns = [str(c) for c in frame.columns]
    rows = [
        [cell(c, v) for c, v in zip(columns, row, strict=True)]
        for row in frame.itertuples(index=False)
    ]
    return Table([header(c) for c in columns], rows)


def pairs(mapping: Mapping[str, Any], *, named: bool = False) -> Table:
    """A mapping as a two-column (setting, value) table: keys as written (names a user types,
    like config fields) or, ``named``, as :func:`header` words; whole numbers without
    thousands separators (ports, seeds), fractions as percentages."""
    rows = []
    for key, value in mapping.items():
        value = scalar(value)
        if str(key).endswith("_frac"):
            shown = percent(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            shown = str(value)
        else:
            shown = cell("", value)
        rows.append([header(str(key)) if named else str(key), shown])
    return Table(["setting", "value"], rows)


def jsonable(value: Any) -> Any:
    """JSON-safe copy: numpy scalars to Python, NaN/inf to None, frames to records."""
    if isinstance(value, pd.DataFrame):
        return [jsonable(r) for r in value.to_dict("records")]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    value = scalar(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
