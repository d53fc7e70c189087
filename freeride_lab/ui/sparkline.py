"""Sparklines: a short history of one number as a small inline SVG, safe to embed in HTML.

    >>> svg = sparkline_svg([40.0, 87.0, 60.0], low=0.0, high=100.0, label="SM % 40 to 87")
    >>> svg.startswith("<svg") and 'aria-label="SM % 40 to 87"' in svg
    True

NaN readings (NVML could not read them) break the line instead of drawing a false zero.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

__all__ = ["sparkline_svg"]


def sparkline_svg(
    values: Sequence[float],
    *,
    low: float,
    high: float,
    label: str,
    color: str = "currentColor",
    width_px: int = 120,
    height_px: int = 28,
) -> str:
    """An SVG polyline of ``values`` (oldest first) scaled from ``low`` to ``high``.

    The SVG scales down with its container (``max-width: 100%``) and is labelled for screen
    readers with ``label``; with fewer than two finite values it draws only a baseline.
    """
    span = high - low if high > low else 1.0
    step = width_px / max(len(values) - 1, 1)
    segments: list[list[str]] = [[]]
    for i, value in enumerate(values):
        if not math.isfinite(value):
            segments.append([])
            continue
        frac = min(max((value - low) / span, 0.0), 1.0)
        y = (height_px - 2) * (1 - frac) + 1
        segments[-1].append(f"{i * step:.1f},{y:.1f}")
    lines = "".join(
        f'<polyline points="{" ".join(points)}" fill="none" stroke="{html.escape(color)}" '
        'stroke-width="1.5" stroke-linejoin="round"/>'
        for points in segments
        if len(points) >= 2
    )
    base = (
        f'<line x1="0" y1="{height_px - 0.5}" x2="{width_px}" y2="{height_px - 0.5}" '
        'stroke="currentColor" stroke-opacity="0.25"/>'
    )
    return (
        f'<svg class="fr-spark" role="img" aria-label="{html.escape(label)}" '
        f'viewBox="0 0 {width_px} {height_px}" width="{width_px}" height="{height_px}" '
        f'preserveAspectRatio="none">{base}{lines}</svg>'
    )
