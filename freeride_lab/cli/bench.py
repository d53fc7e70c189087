"""``freeride-lab bench``: vanilla, managed (with and without the overhead governor) and naive
side tasks side by side on one GPU, with emulated peers (``freeride_lab.bench``; BENCHMARKS.md).

    freeride-lab bench --emulate-peers --quick
    freeride-lab bench --emulate-peers --profile tiny --device cpu --out /tmp/bench.json
    freeride-lab bench --emulate-peers --resume benchmarks/results/h200-2026-12-05.json
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from freeride_lab.cli.app import EXIT_FAILED, EXIT_OK, PROG, UsageError
from freeride_lab.core.runtime_options import OUTLIVED, PREDICTORS, ReplayCosts

__all__ = ["add_bench", "bench_profile_of", "cmd_bench", "resumed_profile_of"]

#: Options that narrow or change a profile: a resumed result keeps the one it was started with.
_PROFILE_OPTIONS: tuple[str, ...] = (
    "profile", "runs", "cases", "real_stage", "repeats", "modes", "block_steps",
    "announce_min_ms", "step_group_ms", "predictor", "outlived", "leftovers", "governor_signals",
    "governor_evidence", "governed_guard", "peer_costs", "schedule", "chunks", "task_options",
)  # fmt: skip


def add_bench(subparsers: Any) -> argparse.ArgumentParser:
    """``bench``: vanilla / managed / governed / naive side tasks side by side on one GPU."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "bench",
        help="benchmark side-task co-location against vanilla training (one GPU, emulated peers)",
        description="In one process tree per run, interleave blocks of training steps with side "
        "tasks parked (vanilla), gated by bubbles (managed, with and without the overhead "
        "governor) and running continuously (naive); report medians and ratios: overhead, "
        "harvest vs the bubble limit, FreeRide's cost saving, signal latency. See BENCHMARKS.md.",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--quick", dest="profile", action="store_const", const="quick",
                       help="the ~6-minute GPU plan (default)")  # fmt: skip
    which.add_argument("--full", dest="profile", action="store_const", const="full",
                       help="every task, M=4 and 8, with and without MPS (hours)")  # fmt: skip
    which.add_argument("--profile", dest="profile", help="a profile by name (e.g. tiny)")
    p.add_argument("--emulate-peers", action="store_true",
                   help="one rank computes on the GPU, its peers replay calibrated costs "
                   "(required: the single-GPU harness is the only one so far)")  # fmt: skip
    p.add_argument("--device", choices=["cuda", "cpu"], default=None,
                   help="where the real stage computes (default: cuda if present)")  # fmt: skip
    p.add_argument("--out", type=Path, default=None,
                   help="results JSON (default benchmarks/results/<h200|cpu>-<date>.json); "
                   "the markdown table goes beside it")  # fmt: skip
    p.add_argument("--run-root", type=Path, default=None, help="where run directories go")
    p.add_argument("--resume", type=Path, default=None, metavar="RESULT",
                   help="continue this result, cut short by its time budget or an interrupt: "
                   "measure only the segments it lacks, with the profile it was started "
                   "with, into the same file (or --out)")  # fmt: skip
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="skip what would not finish within this many seconds")  # fmt: skip
    p.add_argument("--runs", default=None, help="only these runs of the profile (comma list)")
    p.add_argument("--cases", default=None, help="side-task cases: mix and/or task names")
    p.add_argument("--real-stage", default=None, help="'all' or a comma list of stages")
    p.add_argument("--repeats", type=int, default=None, help="repeats of the mode sequence")
    p.add_argument("--modes", default=None,
                   help="these modes, vanilla first (comma list of vanilla, managed, governed, "
                   "trickle, naive); default: each run's own")  # fmt: skip
    p.add_argument("--block-steps", type=int, default=None, help="measured steps per block")
    p.add_argument("--announce-min-ms", type=float, default=None,
                   help="announce bubbles predicted this long (default 1; 0: all)")  # fmt: skip
    p.add_argument("--step-group-ms", type=float, default=None,
                   help="group short side-task steps to this length (ms; 0: off)")  # fmt: skip
    p.add_argument("--predictor", default=None, choices=PREDICTORS,
                   help="how the real rank predicts bubble lengths: the minimum of the last "
                   "five (default, FreeRide's), a percentile moved by its misses (feedback), "
                   "or the end its awaited peer published (peers)")  # fmt: skip
    p.add_argument("--outlived", default=None, choices=OUTLIVED,
                   help="once a bubble outlives its predicted end, the side task stops "
                   "(default, FreeRide's) or goes on while the slot's longer bubbles say a "
                   "step fits (survivors); hand-on: as survivors, but past the predicted end "
                   "a stage's bubble is its leftovers task's alone")  # fmt: skip
    p.add_argument("--leftovers", default=None, metavar="TASK",
                   help="attach TASK beside every segment's task with gating 'leftovers': it "
                   "takes the bubble time the segment's task leaves")  # fmt: skip
    p.add_argument("--governor-signals", choices=["on", "off"], default=None,
                   help="governed and trickle blocks also back off on board power near its "
                   "cap and SM clock drops (on, default) or on step time alone (off)")  # fmt: skip
    p.add_argument("--governor-evidence", type=float, default=None,
                   help="one-sided confidence a governor change needs (default 0.95; 0.5: "
                   "act on the measured mean alone)")  # fmt: skip
    p.add_argument("--governed-guard", default=None, metavar="FACTOR,SLACK_MS",
                   help="the step guard governed blocks start from: the solo step's p95 x "
                   "FACTOR + SLACK_MS (default 1.1,0.5)")  # fmt: skip
    p.add_argument("--peer-costs", type=Path, default=None, metavar="RESULT",
                   help="emulated peers replay the calibration this bench result recorded "
                   "instead of calibrating anew, so the arms of an A/B run in two invocations "
                   "have alike bubbles")  # fmt: skip
    p.add_argument("--schedule", default=None,
                   help="pipeline schedule (default 1F1B); Interleaved1F1B and "
                        "InterleavedZeroBubble run on every torch")  # fmt: skip
    p.add_argument(
        "--chunks",
        type=int,
        default=None,
        help="stage chunks per rank for --schedule (default: the schedule's)",
    )
    p.add_argument("--task-options", default=None, metavar="JSON",
                   help='options per task, e.g. {"resnet18": {"micro_batches": 4}}')  # fmt: skip
    return p


def _task_options(text: str, base: Any) -> dict[str, dict[str, Any]]:
    """``--task-options`` merged over the profile's: a JSON object of task -> options."""
    import json

    try:
        given = json.loads(text)
    except ValueError as exc:
        raise ValueError(
            f"--task-options is not JSON ({exc}); e.g. '{{\"resnet18\": {{}}}}'"
        ) from None
    if not isinstance(given, dict) or not all(isinstance(v, dict) for v in given.values()):
        raise ValueError(
            f"--task-options={text!r} must be a JSON object of task name -> options object"
        )
    from freeride_lab.tasks import registry

    unknown = [name for name in given if not registry.is_known(name)]
    if unknown:  # options for a task no block runs would be dropped without a word
        raise ValueError(
            f"--task-options names unknown task(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(registry.names())}"
        )
    merged = {name: dict(opts) for name, opts in base.items()}
    for name, opts in given.items():
        merged[name] = {**merged.get(name, {}), **opts}
    return merged


def bench_profile_of(args: argparse.Namespace, device: str) -> Any:
    """The ``bench.profiles.BenchProfile`` that ``bench``'s options pick and narrow (ValueError
    if bad)."""
    import dataclasses

    from freeride_lab.bench.profiles import bench_profile

    profile = bench_profile(args.profile or "quick", device)
    runs = profile.runs
    if args.runs:
        wanted = [x.strip() for x in args.runs.split(",") if x.strip()]
        unknown = sorted(set(wanted) - {r.name for r in runs})
        if unknown:
            valid = ", ".join(r.name for r in runs)
            raise ValueError(f"unknown run(s) {unknown} in profile {profile.name}; valid: {valid}")
        runs = tuple(r for r in runs if r.name in wanted)
    changes: dict[str, Any] = {}
    if args.cases:
        cases = tuple(x.strip() for x in args.cases.split(",") if x.strip())
        runs = tuple(dataclasses.replace(r, cases=cases) for r in runs)
    if args.real_stage:
        stages: tuple[int, ...] | None = (
            None if args.real_stage == "all" else tuple(int(x) for x in args.real_stage.split(","))
        )
        runs = tuple(dataclasses.replace(r, real_stages=stages) for r in runs)
    if args.modes:
        modes = tuple(x.strip() for x in args.modes.split(",") if x.strip())
        try:
            runs = tuple(dataclasses.replace(r, modes=modes) for r in runs)
        except ValueError as exc:
            raise UsageError(f"--modes {args.modes}: {exc}") from exc
    layout = {n: getattr(args, n) for n in ("schedule", "chunks") if getattr(args, n) is not None}
    if layout:
        try:
            profile = profile.replace(runs=runs, **layout)
        except ValueError as exc:
            given = " ".join(f"--{n} {v}" for n, v in layout.items())
            raise UsageError(f"{given}: {exc}") from exc
    for name in ("time_budget_s", "repeats", "block_steps", "announce_min_ms", "step_group_ms",
                 "predictor", "outlived", "leftovers"):  # fmt: skip
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    if args.governor_signals is not None:
        changes["governor_device_signals"] = args.governor_signals == "on"
    if args.governor_evidence is not None:
        changes["governor_evidence"] = args.governor_evidence
    if args.peer_costs is not None:
        changes["peer_costs"] = peer_costs_of(args.peer_costs)
    if args.governed_guard is not None:
        factor, _, slack = args.governed_guard.partition(",")
        try:
            changes["governed_guard_factor"] = float(factor)
            changes["governed_guard_slack_ms"] = float(slack) if slack else 0.0
        except ValueError as exc:
            raise UsageError(
                f"--governed-guard {args.governed_guard}: expected FACTOR,SLACK_MS (e.g. 1.1,0.5)"
            ) from exc
    if args.task_options:
        changes["task_options"] = _task_options(args.task_options, profile.task_options)
    profile = profile.replace(runs=runs, **changes)
    return profile


def peer_costs_of(path: Path) -> tuple[ReplayCosts, ...]:
    """The calibration a bench result recorded (its first run that has one), as the costs its
    peers replay (``EmulateOptions.costs``); UsageError if the file has none."""
    try:
        data = json.loads(path.read_text())
        reports = next(r["calibration"] for r in data["runs"] if r.get("calibration"))
        return tuple(ReplayCosts.from_report(c) for c in sorted(reports, key=lambda c: c["rank"]))
    except (OSError, ValueError, KeyError, TypeError, StopIteration) as exc:
        raise UsageError(
            f"--peer-costs {path}: not a bench result with a recorded calibration ({exc})"
        ) from exc


def resumed_profile_of(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The profile and result that ``--resume`` continues (``bench.resume``); only
    ``--time-budget-s`` changes the profile (ValueError or UsageError if anything is off)."""
    from freeride_lab.bench import resume

    given = [f"--{n.replace('_', '-')}" for n in _PROFILE_OPTIONS if getattr(args, n, None)]
    if given:
        raise UsageError(
            f"--resume continues the profile its result was started with; drop {', '.join(given)}"
            " (only --time-budget-s, --out and --run-root apply to the call that continues it)"
        )
    result = resume.load_result(args.resume)
    profile = resume.profile_of(result)
    if args.device is not None and args.device != profile.device:
        raise UsageError(
            f"--device {args.device}: {args.resume} was measured on {profile.device}; "
            "continue it there or start a new result"
        )
    if args.time_budget_s is not None:
        profile = profile.replace(time_budget_s=args.time_budget_s)
    return profile, result


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark, print progress with time stamps, then the markdown tables."""
    import time

    from freeride_lab.bench import driver as bench
    from freeride_lab.bench import markdown as bench_markdown
    from freeride_lab.bench import results as bench_results
    from freeride_lab.bench import resume
    from freeride_lab.bench.resume import OtherSetup

    if not args.emulate_peers:
        raise UsageError(
            "bench needs --emulate-peers: the single-GPU harness (one real stage, emulated "
            "peers) is the only one so far; a real multi-GPU run is a separate issue"
        )
    resumed = None
    try:
        if args.resume is not None:
            profile, resumed = resumed_profile_of(args)
            device = profile.device
        else:
            device = args.device or ("cuda" if _cuda_present() else "cpu")
            profile = bench_profile_of(args, device)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.out is None and args.resume is not None:
        out = args.resume
    elif args.out is None and device == "cuda":
        from freeride_lab.gpu import nvml

        out = bench_results.default_out(device, nvml.device_name(0))
    else:
        out = args.out or bench_results.default_out(device)
    t0 = time.monotonic()

    def progress(line: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        print(f"[{stamp} +{time.monotonic() - t0:5.0f}s] {line}", file=sys.stderr, flush=True)

    what = f"continuing {args.resume}" if resumed is not None else f"{len(profile.runs)} run(s)"
    progress(f"bench {profile.name} on {device}: {what}, "
             f"time budget {profile.time_budget_s:.0f} s, results -> {out}")  # fmt: skip
    # Ctrl-C, and SIGTERM (e.g. from `timeout`), end the current run cleanly and keep what was
    # measured; SIGINT may arrive ignored from a non-interactive parent shell, so restore it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous_term = signal.signal(signal.SIGTERM, _interrupt)
    try:
        result = bench.run_bench(profile, out=out, run_root=args.run_root, progress=progress,
                                 command=[PROG, *getattr(args, "argv", sys.argv[1:])],
                                 resume=resumed)  # fmt: skip
    except OtherSetup as e:  # the result cannot be continued here (bench.resume)
        raise UsageError(str(e)) from None
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.signal(signal.SIGTERM, previous_term)
    print(bench_markdown.markdown(result))
    progress(f"done in {time.monotonic() - t0:.0f} s; wrote {out} and {out.with_suffix('.md')}")
    left = resume.left_to_measure(profile, result)
    if left:
        seconds = resume.budget_to_finish_s(profile, result) or "SECONDS"
        again = f"{PROG} bench --emulate-peers --resume {out} --time-budget-s {seconds}"
        progress(f"not measured ({len(left)}): {'; '.join(left)}; measure them with `{again}`")
    return EXIT_OK if result.get("blocks") else EXIT_FAILED


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _cuda_present() -> bool:
    """A CUDA device is visible (without initialising CUDA in this process)."""
    import glob

    return bool(glob.glob("/dev/nvidia[0-9]*"))
