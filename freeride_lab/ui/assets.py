"""Front-end assets (ES modules and CSS) for the anywidget widgets, found in wheels and checkouts.

A wheel carries the repository's top-level ``widgets/`` as the package data directory
``freeride_lab/_widgets/`` (hatch force-include, see pyproject.toml). Editable installs do not
get force-included files, so the lookup falls back to ``<repo>/widgets/`` beside the package.

    >>> asset_path("board.js").name
    'board.js'
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["asset_dirs", "asset_path"]

_PACKAGE_DIR = Path(__file__).resolve().parent.parent  # .../freeride_lab


def asset_dirs() -> list[Path]:
    """Directories searched for assets, in order: the package data dir, then the repo's widgets/."""
    return [_PACKAGE_DIR / "_widgets", _PACKAGE_DIR.parent / "widgets"]


def asset_path(name: str, search: Sequence[Path] | None = None) -> Path:
    """The path of asset ``name`` (``"board.js"``) in the first directory of ``search`` that has it.

    Raises:
        FileNotFoundError: no directory has it; the message lists where it looked.
    """
    dirs = asset_dirs() if search is None else list(search)
    for directory in dirs:
        candidate = directory / name
        if candidate.is_file():
            return candidate
    looked = ", ".join(str(d) for d in dirs)
    raise FileNotFoundError(
        f"widget asset {name!r} not found in {looked}; reinstall freeride-lab "
        "(`pip install -e .` in a checkout keeps the repository's widgets/ directory)"
    )
