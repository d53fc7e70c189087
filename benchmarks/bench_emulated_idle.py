"""Where the emulated pipeline's idle time goes, schedule by schedule, with no side task.

For each schedule, one emulated run of the bench's model (``bench_profile``'s quick profile on
the chosen device) with one real rank and its side tasks parked, a fixed number of steps; then
per rank the measured bubble fraction beside theory and the attribution of the bubble time
(``Session.summary``: schedule idle given the run's own action costs, waiting on a peer, host
overhead), and the per-kind median action costs. This answers "why is the harness's measured
idle above theory" before any side task runs.

    python benchmarks/bench_emulated_idle.py --device cuda --schedules 1F1B,InterleavedZeroBubble \\
        --out benchmarks/results/emulated-idle-h200-DATE.json

``--wire-d-model 256,16`` and ``--loss-on device,host`` run each schedule once per width and
per place of the last stage's loss, one after the other in the same call (side by side).
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_output import command_line

from freeride_lab.bench.profiles import bench_profile, run_config
from freeride_lab.core.theory import theory_bubble_fraction
from freeride_lab.lab.session import Session
from freeride_lab.pipeline.emulate_control import Control, ControlFile, Gate

COLUMNS = ("rank", "measured_frac", "theory_frac", "bubble_ms_per_step", "schedule_ms_per_step",
           "peer_ms_per_step", "host_ms_per_step")  # fmt: skip


def one_schedule(
    schedule: str,
    *,
    device: str,
    real_rank: int,
    steps: int,
    skip: int,
    root: Path,
    wire_d_model: int | None = None,
    loss_on: str | None = None,
) -> dict[str, Any]:
    profile = bench_profile("quick", device).replace(schedule=schedule, chunks=None)
    if wire_d_model is not None:
        profile = profile.replace(wire_d_model=wire_d_model)
    if loss_on is not None:
        profile = profile.replace(loss_on=loss_on)
    plan = profile.runs[0]
    name = f"{schedule}-w{profile.wire_d_model}-loss-{profile.loss_on}-{int(time.time())}"
    run_dir = root / name
    config = run_config(profile, plan, run_dir).replace(steps=steps)
    session = Session.launch(config, grace_s=20.0)
    try:
        ControlFile(run_dir).write(Control(seq=1, real_rank=real_rank, gate=Gate.CLOSED))
        state = session.wait(timeout_s=900)
    finally:
        session.stop()  # a run that hung or failed leaves nothing running
    applied_log = (run_dir / "emulate" / "applied.jsonl").read_text().splitlines()
    applied = [json.loads(line) for line in applied_log if line.strip()]
    first = max([skip] + [a["step"] for a in applied if a["seq"] == 1])
    summary = session.summary(skip_steps=first)
    actions = session.actions
    actions = actions[actions["step"] >= first]
    costs = (
        actions.assign(ms=actions["end_ms"] - actions["start_ms"])
        .groupby(["rank", "action"])["ms"]
        .median()
        .round(2)
    )
    return {
        "schedule": schedule,
        "wire_d_model": profile.wire_d_model,
        "loss_on": profile.loss_on,
        "state": str(state),
        "stages": config.stages,
        "microbatches": config.microbatches,
        "chunks": config.chunks,
        "real_rank": real_rank,
        "steps_measured": int(actions["step"].nunique()),
        "theory_frac": theory_bubble_fraction(
            schedule, config.stages, config.microbatches, config.chunks
        ),
        "per_rank": summary[[c for c in COLUMNS if c in summary]].round(4).to_dict("records"),
        "action_ms": [
            {"rank": int(r), "action": str(a), "median_ms": float(v)} for (r, a), v in costs.items()
        ],
        "run_dir": run_dir.name,
    }


def _widths(text: str) -> list[int]:
    """``--wire-d-model``: positive integers, comma separated (the model width must be a
    multiple of each; the run's config says so if it is not)."""
    try:
        widths = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        widths = []
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers, e.g. 256,16")
    return widths


def _places(text: str) -> list[str]:
    """``--loss-on``: ``device`` and/or ``host``, comma separated."""
    places = [p.strip() for p in text.split(",") if p.strip()]
    if not places or not set(places) <= {"device", "host"}:
        raise argparse.ArgumentTypeError(f"{text!r}: give device, host or device,host")
    return places


def _print(r: dict[str, Any]) -> None:
    head = f"{r['schedule']} wire {r['wire_d_model']} loss on {r.get('loss_on', 'host')}"
    print(f"{head}: theory {r['theory_frac']:.3f}", flush=True)
    for row in r["per_rank"]:
        print("  ", row, flush=True)
    costs = ", ".join(f"r{a['rank']} {a['action']} {a['median_ms']}" for a in r["action_ms"])
    print("   action ms:", costs, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--schedules", default="1F1B,Interleaved1F1B,InterleavedZeroBubble")
    ap.add_argument("--real-rank", type=int, default=1)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=3, help="leading steps left out (warm-up)")
    ap.add_argument("--run-root", type=Path, default=None)
    ap.add_argument("--wire-d-model", type=_widths, default=[],
                    help="comma list of wire widths (default: the profile's)")  # fmt: skip
    ap.add_argument("--loss-on", type=_places, default=[],
                    help="comma list of where the last stage's loss runs: device, host "
                         "(default: the profile's)")  # fmt: skip
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    root = args.run_root or Path(tempfile.mkdtemp(prefix="emulated-idle-"))
    results = []
    wires: list[int | None] = [*args.wire_d_model] or [None]
    places: list[str | None] = [*args.loss_on] or [None]
    for schedule in args.schedules.split(","):
        for wire, place in itertools.product(wires, places):
            r = one_schedule(schedule, device=args.device, real_rank=args.real_rank,
                             steps=args.steps, skip=args.skip, root=root,
                             wire_d_model=wire, loss_on=place)  # fmt: skip
            results.append(r)
            _print(r)
    args.out.parent.mkdir(parents=True, exist_ok=True)

    record = {"benchmark": "emulated_idle", "command": command_line(),
              "date": time.strftime("%Y-%m-%d"), "machine": platform.node(),
              "results": results}  # fmt: skip
    args.out.write_text(json.dumps(record, indent=1, default=str))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
