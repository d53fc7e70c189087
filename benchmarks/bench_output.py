"""What the benchmark scripts share when they record a result: the results file, and the CPU.

Each benchmark runs as a script (``python benchmarks/bench_<name>.py``), so this folder is on
its ``sys.path`` and ``from bench_output import write_results`` finds this module.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any


def write_results(record: dict[str, Any], out: Path, *, indent: int = 2) -> Path:
    """Write ``record`` to ``out`` as JSON (its folder made if missing) and say where."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=indent) + "\n")
    print(f"wrote {out}")
    return out


def cpu_model() -> str:
    """The CPU's model name, as a bench result records it; "" where that cannot be read."""
    from freeride_lab.bench.results import cpu_model as recorded

    return recorded() or ""


def command_line() -> str:
    """This benchmark's command as a reader would type it: ``python`` and the arguments as
    given, without the interpreter's path on this machine."""
    return shlex.join(["python", *sys.argv])
