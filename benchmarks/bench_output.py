"""What the benchmark scripts share when they record a result: the results file, the CPU, and
how a script that reads a bench result's run directories names and walks them.

Each benchmark runs as a script (``python benchmarks/bench_<name>.py``), so this folder is on
its ``sys.path`` and ``from bench_output import write_results`` finds this module.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Iterator, Mapping
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


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of a script that reads a bench result and its run directories."""
    parser.add_argument("result", type=Path, help="a freeride-lab bench result (JSON)")
    parser.add_argument(
        "--run-root",
        type=Path,
        required=True,
        help="the folder the bench's --run-root named (its run directories)",
    )


def bench_runs(
    result: Mapping[str, Any], run_root: Path
) -> Iterator[tuple[Mapping[str, Any], list[Mapping[str, Any]], list[dict[str, Any]]]]:
    """Each run of a bench ``result``: the run, its blocks and its run directory's events (the
    directory found under ``run_root`` by its name, wherever the bench wrote it)."""
    from freeride_lab.lab.tables import read_events

    for run in result["runs"]:
        blocks = [b for b in result["blocks"] if b["run"] == run["name"]]
        events = read_events(run_root / Path(str(run["run_dir"])).name)
        yield run, blocks, events
