"""A notebook user's first minute: how long the launch cell takes, until the first step, and stop.

    python benchmarks/bench_launch.py                   # 2 rounds; a few minutes on 2 cores
    python benchmarks/bench_launch.py --rounds 3 --out /tmp/launch.json

Runs the quickstart's CPU run (``%freeride launch --schedule 1F1B --stages 4 --microbatches 4
--steps 1000 --workload synthetic``) in fresh interpreters, each standing in for a notebook
kernel, two ways:

- ``api``: ``from freeride_lab.lab import Session``, the quickstart's ``RunConfig`` and
  ``Session.launch`` (what a script, or the magic's lab half, does);
- ``magic``: a real IPython shell that has loaded the extension (``%load_ext freeride_lab``,
  not timed: the notebook's first cell) runs ``%freeride launch ...``, which also displays the
  run's dashboard.

Per interpreter the launch is timed twice: ``cold`` (the first launch in a fresh interpreter:
every import is paid) and, after that run is stopped, ``warm`` (the same launch again). Each
launch also times its first step event (from the start of the cell until ``Session.progress``
turns from "calibrating…" to "step …": a rank recorded step 0) and the stop
(``session.stop()``, or the ``%freeride stop`` cell). Medians over the rounds are printed; the
JSON goes to ``results/launch-cpu-<date>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench_output import write_results

RESULTS = Path(__file__).parent / "results"
REPO = Path(__file__).resolve().parents[1]
LAUNCH_ARGS = "--schedule 1F1B --stages 4 --microbatches 4 --steps 1000 --workload synthetic"

# One kernel: launch cold, wait for the first step, stop; launch warm, the same again.
KERNEL = textwrap.dedent(
    """
    import json, sys, time
    MODE, RUNS = sys.argv[1], sys.argv[2]
    ARGS = {args!r}
    FIRST_STEP_S = 600.0

    def launch(run_dir):
        if MODE == "api":
            t0 = time.perf_counter()
            from freeride_lab.core.config import RunConfig
            from freeride_lab.lab import Session
            config = RunConfig(
                schedule="1F1B", stages=4, microbatches=4, steps=1000, workload="synthetic"
            )
            session = Session.launch(config, run_dir=run_dir)
            return session, t0, time.perf_counter()
        ip = shell()
        t0 = time.perf_counter()
        ip.run_line_magic("freeride", f"launch {{ARGS}} --run-dir {{run_dir}}")
        return ip.user_ns["session"], t0, time.perf_counter()

    _shell = []
    def shell():
        if not _shell:
            from IPython.core.interactiveshell import InteractiveShell
            ip = InteractiveShell.instance()
            ip.run_line_magic("load_ext", "freeride_lab")  # the notebook's first cell
            _shell.append(ip)
        return _shell[0]

    if MODE == "magic":
        shell()  # loading the extension is a cell of its own, not the launch cell
    out = {{}}
    for name in ("cold", "warm"):
        session, t0, returned = launch(f"{{RUNS}}/{{name}}")
        loaded = [m for m in ("torch", "pandas", "anywidget") if m in sys.modules]
        phases = [session.progress]
        while not session.progress.startswith("step") and time.perf_counter() - t0 < FIRST_STEP_S:
            if session.progress != phases[-1]:
                phases.append(session.progress)
            time.sleep(0.02)
        first_step = time.perf_counter()
        phases.append(session.progress)
        s0 = time.perf_counter()
        if MODE == "api":
            session.stop()
        else:
            shell().run_line_magic("freeride", "stop")  # also shows the dashboard's last state
        stopped = time.perf_counter()
        out[name] = {{
            "launch_cell_s": returned - t0,
            "first_step_s": first_step - t0,
            "stop_s": stopped - s0,
            "phases": phases + [session.progress],
            "loaded_at_return": loaded,
        }}
    print("RESULT " + json.dumps(out))
    """
).format(args=LAUNCH_ARGS)


def one_kernel(mode: str) -> dict[str, Any]:
    """A fresh interpreter (a new kernel) that launches cold, then warm; its timings."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as runs:
        done = subprocess.run(
            [sys.executable, "-c", KERNEL, mode, runs],
            capture_output=True,
            text=True,
            env=env,
            cwd=runs,
            timeout=1800,
            check=False,
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{mode} kernel failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="fresh kernels per mode")
    parser.add_argument("--modes", default="api,magic", help="api, magic or both")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    rounds: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for i in range(args.rounds):
        for mode in modes:
            result = one_kernel(mode)
            rounds[mode].append(result)
            for name, r in result.items():
                loaded = ", ".join(r["loaded_at_return"]) or "none of torch, pandas, anywidget"
                phases = " → ".join(dict.fromkeys(r["phases"]))
                print(
                    f"round {i + 1} {mode:5} {name}: launch cell {r['launch_cell_s']:.2f} s, "
                    f"first step {r['first_step_s']:.1f} s, stop {r['stop_s']:.2f} s; "
                    f"loaded at return: {loaded}; {phases}",
                    flush=True,
                )
    medians: dict[str, dict[str, dict[str, float]]] = {}
    print(f"\nmedians over {args.rounds} round(s) (s):")
    print(f"{'mode':6} {'launch':6} {'cell (s)':>9}  {'first step (s)':>14}  {'stop (s)':>8}")
    for mode, results in rounds.items():
        medians[mode] = {}
        for name in ("cold", "warm"):
            keys = ("launch_cell_s", "first_step_s", "stop_s")
            m = {k: statistics.median(r[name][k] for r in results) for k in keys}
            medians[mode][name] = m
            print(
                f"{mode:6} {name:6} {m['launch_cell_s']:9.2f}  {m['first_step_s']:14.1f}  "
                f"{m['stop_s']:8.2f}"
            )
    record = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": {"python": platform.python_version(), "cpus": os.cpu_count(),
                 "load_1m": os.getloadavg()[0]},
        "config": LAUNCH_ARGS,
        "rounds": rounds,
        "medians": medians,
    }  # fmt: skip
    write_results(record, args.out or RESULTS / f"launch-cpu-{datetime.now(UTC):%Y-%m-%d}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
