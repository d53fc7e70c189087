"""Options of the built-in side tasks: presets, name checks and value checks.

Every built-in task takes its options as keyword arguments (they arrive from JSON, the CLI or a
notebook), merges them over a named preset and builds a frozen, validated options dataclass::

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True, kw_only=True)
    ... class Opts:
    ...     size: int = 8
    >>> resolve_options("Demo", Opts, {"cpu": {}, "gpu": {"size": 64}}, {"preset": "gpu"})
    Opts(size=64)

``preset="cpu"`` (the default) is small enough for one step in roughly 50-200 ms on a laptop
core; ``preset="gpu"`` is the size FreeRide ran (paper §12). Explicit options override the preset.
This module imports neither torch nor numpy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

__all__ = [
    "check_choice",
    "check_float",
    "check_int",
    "resolve_options",
]

T = TypeVar("T")


def resolve_options(
    task: str,
    options_type: type[T],
    presets: Mapping[str, Mapping[str, Any]],
    options: Mapping[str, Any],
) -> T:
    """Build ``options_type`` from ``presets[options["preset"]]`` overridden by ``options``.

    Args:
        task: the task class name, for error messages.
        options: user options; the key ``preset`` picks the base ("cpu" when absent).

    Raises:
        ValueError: unknown preset or unknown option name (the message lists the valid ones),
            or a value the options dataclass rejects.
        TypeError: a value of the wrong type.
    """
    given = dict(options)
    preset = given.pop("preset", "cpu")
    if preset not in presets:
        raise ValueError(
            f"{task}: preset={preset!r} is unknown; valid: {', '.join(map(repr, presets))}"
        )
    names = [f.name for f in dataclasses.fields(options_type)]  # type: ignore[arg-type]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(
            f"{task}: unknown option(s) {', '.join(map(repr, unknown))}; "
            f"valid: preset, {', '.join(names)}"
        )
    try:
        return options_type(**{**presets[preset], **given})
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{task}: {exc}") from None


def check_int(name: str, value: object, *, minimum: int = 1, optional: bool = False) -> None:
    """Raise unless ``value`` is an int >= ``minimum`` (or None when ``optional``)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        none = " or None" if optional else ""
        raise TypeError(f"{name}={value!r} must be an int{none}, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}; raise it to {minimum}")


def check_float(
    name: str,
    value: object,
    *,
    low: float,
    high: float = float("inf"),
    low_open: bool = False,
) -> None:
    """Raise unless ``value`` is a number in ``[low, high]`` (``(low, high]`` if ``low_open``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name}={value!r} must be a number, not {type(value).__name__}")
    bracket = "(" if low_open else "["
    too_low = value <= low if low_open else value < low
    if too_low or value > high or value != value:  # value != value: NaN
        raise ValueError(
            f"{name}={value!r} must lie in {bracket}{low}, {high}]; pick a value inside"
        )


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    """Raise unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} is unknown; valid: {', '.join(map(repr, choices))}")
