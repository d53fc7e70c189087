"""The command line, ``freeride-lab run|attach|report|bench|...``: ``app`` (the parser and
commands), ``runs`` (the commands that start or read runs) and ``hints`` (completion and "did you
mean", shared with the ``%freeride`` magics).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``freeride-lab`` (``freeride_lab.cli.app.main``); returns the exit code."""
    from freeride_lab.cli.app import main as run

    return run(argv)
