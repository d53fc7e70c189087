"""Archives of run directories for sharing: logs, event files, never a run's secret.

    python -m freeride_lab.lab.archive logs   RUNS OUT/bench-logs.tgz     # all but events/, tasks/
    python -m freeride_lab.lab.archive events RUNS OUT/bench-events.tgz   # <run>/events/ only

``RUNS`` is a folder of run directories (a bench's ``--run-root``) or one run directory. Only
regular files are packed: symlinks, sockets and pipes (an MPS daemon's) are left out, and so is
every file named in ``rundir.PRIVATE_FILES`` (the run's secret, which would let the archive's
reader drive a run still going; see [Note: a private run directory]).
"""

from __future__ import annotations

import argparse
import os
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from freeride_lab.io.rundir import PRIVATE_FILES

__all__ = ["Kind", "pack", "packable"]

Kind = Literal["logs", "events"]
_BULKY = frozenset({"events", "tasks"})  # event files and task checkpoints: not in "logs"


def packable(root: Path, kind: Kind) -> list[Path]:
    """The files under ``root`` that a ``kind`` archive holds, relative to ``root``, sorted."""
    chosen: list[Path] = []
    for folder, dirs, files in os.walk(root, followlinks=False):
        rel_dir = Path(folder).relative_to(root)
        if kind == "logs":
            dirs[:] = [d for d in dirs if d not in _BULKY]
        for name in files:
            rel = rel_dir / name
            if name in PRIVATE_FILES or (kind == "events" and "events" not in rel.parts[:-1]):
                continue
            if (root / rel).is_symlink() or not (root / rel).is_file():
                continue
            chosen.append(rel)
    return sorted(chosen)


def pack(root: str | os.PathLike[str], out: str | os.PathLike[str], kind: Kind) -> list[str]:
    """Write a gzipped tar of ``root``'s ``kind`` files to ``out``; the member names written."""
    root, out = Path(root), Path(out)
    if not root.is_dir():
        raise NotADirectoryError(f"{str(root)!r} is not a folder of run directories")
    members = packable(root, kind)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tar:
        for rel in members:
            tar.add(root / rel, arcname=str(rel), recursive=False)
    return [str(m) for m in members]


def main(argv: Iterable[str] | None = None) -> int:
    """Entry point of ``python -m freeride_lab.lab.archive``."""
    parser = argparse.ArgumentParser(prog="python -m freeride_lab.lab.archive")
    parser.add_argument("kind", choices=["logs", "events"])
    parser.add_argument("root", help="a folder of run directories, or one run directory")
    parser.add_argument("out", help="the .tgz to write")
    args = parser.parse_args(None if argv is None else list(argv))
    try:
        members = pack(args.root, args.out, args.kind)
    except OSError as exc:
        print(f"archive: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.out}: {len(members)} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
