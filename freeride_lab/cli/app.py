"""``freeride-lab``: the command line. ``build_parser()`` is the one grammar, shared with the
``%freeride`` notebook magics.

    freeride-lab run --schedule 1F1B --stages 4 --microbatches 8 --steps 20
    freeride-lab simulate --schedule Interleaved1F1B --stages 4 --microbatches 8
    freeride-lab launch --steps 500; freeride-lab attach RUN_DIR pagerank   (see cli/runs.py)

Adding a subcommand: write ``add_<name>(subparsers) -> ArgumentParser`` and
``cmd_<name>(args) -> int`` in any module (keep its top-level imports light: ``--help`` imports
it) and add ``"<name>": "<module>"`` to ``SUBCOMMANDS``. A handler raises ``UsageError`` for bad
input before anything has started; ``main`` prints it as one line and exits with code 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import math
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from freeride_lab.core.runtime_options import OUTLIVED, PREDICTORS
from freeride_lab.core.schedule import SCHEDULES

if TYPE_CHECKING:
    from freeride_lab.lab.session import Session

__all__ = ["SUBCOMMANDS", "UsageError", "build_parser", "costs_ms", "main", "os_error_text"]

PROG = "freeride-lab"

# name -> module defining add_<name>(subparsers) and cmd_<name>(args); in help order.
SUBCOMMANDS: dict[str, str] = {
    "run": "freeride_lab.cli.app",
    "launch": "freeride_lab.cli.runs",
    "status": "freeride_lab.cli.runs",
    "list": "freeride_lab.cli.runs",
    "attach": "freeride_lab.cli.runs",
    "tune": "freeride_lab.cli.runs",
    "checkpoint": "freeride_lab.cli.runs",
    "detach": "freeride_lab.cli.runs",
    "stop": "freeride_lab.cli.runs",
    "report": "freeride_lab.cli.runs",
    "simulate": "freeride_lab.cli.app",
    "bench": "freeride_lab.cli.bench",
}

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class UsageError(Exception):
    """Bad command-line input; nothing was started. ``main`` prints it and exits 2."""


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that raises ``UsageError`` instead of printing and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser(prog: str = PROG) -> CommandParser:
    """The parser of every subcommand in ``SUBCOMMANDS``; each sets ``args.handler``."""
    parser = CommandParser(
        prog=prog,
        description="Measure the bubbles of pipeline-parallel training and run side tasks in them.",
    )
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level (default: WARNING)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        sub: argparse.ArgumentParser = getattr(module, f"add_{name}")(subparsers)
        sub.set_defaults(handler=f"{module_name}:cmd_{name}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``freeride-lab``; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)  # what the user typed, for records
        logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
        return _handler(args.handler)(args)
    except UsageError as e:
        message = str(e).replace("\r", "\\r").replace("\n", "\\n")  # always one line
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return EXIT_USAGE


def _handler(spec: str) -> Callable[[argparse.Namespace], int]:
    module_name, _, attr = spec.partition(":")
    handler: Callable[[argparse.Namespace], int] = getattr(
        importlib.import_module(module_name), attr
    )
    return handler


# -- run -----------------------------------------------------------------------------------------


def _add_shape_options(p: argparse.ArgumentParser) -> None:
    """Schedule and sizes, shared by ``run`` and ``simulate``."""
    p.add_argument(
        "--schedule",
        default="1F1B",
        help=f"torch schedule name, any case (default 1F1B); one of: {', '.join(SCHEDULES)}",
    )
    p.add_argument("--stages", type=int, default=4, help="pipeline ranks S (default 4)")
    p.add_argument("--microbatches", type=int, default=8, help="micro-batches M (default 8)")
    p.add_argument("--chunks", type=int, default=None, help="model chunks per rank V")
    each = "one number per rank (split over its chunks) or a comma list, one per stage chunk"
    p.add_argument("--t-forward-ms", type=costs_ms, default=None, help=f"synthetic F cost: {each}")
    p.add_argument(
        "--t-backward-input-ms", type=costs_ms, default=None, help=f"synthetic I cost: {each}"
    )
    p.add_argument(
        "--t-backward-weight-ms", type=costs_ms, default=None, help=f"synthetic W cost: {each}"
    )


def costs_ms(text: str) -> float | tuple[float, ...]:
    """A ``--t-*-ms`` value: ``"10"`` (every stage) or ``"10,10,20,10"`` (one per stage chunk).

    Only the spelling is checked here; ``RunConfig`` checks the values and the count.
    """
    parts = text.split(",")
    try:
        values = tuple(float(x) for x in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of ms or a comma list of them; e.g. 10 or 10,10,20,10"
        ) from None
    return values[0] if len(parts) == 1 else values


def add_run(subparsers: Any) -> argparse.ArgumentParser:
    """``run``: launch a training run, follow it, print its bubbles."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "run",
        help="launch a pipeline training run and report its bubbles",
        description="Launch a pipeline training run (torchrun, one process per stage), show "
        "progress, then print per-rank bubbles and measured vs theory. Ctrl-C stops the run.",
    )
    add_run_options(p)
    p.add_argument(
        "--min-bubble-ms",
        type=float,
        default=0.0,
        help="leave gaps shorter than this out of the bubble table (default 0)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def add_run_options(p: argparse.ArgumentParser) -> None:
    """What defines a run (``RunConfig``) and how it stops; shared by ``run`` and ``launch``."""
    _add_shape_options(p)
    p.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    p.add_argument("--workload", choices=["text", "synthetic"], default=None)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None)
    p.add_argument("--layers", type=int, default=None, help="GPT blocks (text workload)")
    p.add_argument("--d-model", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--microbatch-size", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--run-dir", default=None, help="run directory (default ./runs/<run_id>)")
    p.add_argument("--nnodes", type=int, default=None)
    p.add_argument("--node-rank", type=int, default=None)
    p.add_argument("--master-addr", default=None)
    p.add_argument("--master-port", type=int, default=None)
    p.add_argument(
        "--grace-s", type=float, default=10.0, help="SIGTERM to SIGKILL delay on stop (default 10)"
    )
    p.add_argument(
        "--no-side-tasks",
        dest="side_tasks",
        action="store_false",
        default=None,
        help="no side-task workers beside the ranks (vanilla; attach is then refused)",
    )
    p.add_argument(
        "--mps",
        choices=["auto", "on", "off"],
        default="auto",
        help="a private CUDA MPS daemon for the run (default auto: when available on CUDA)",
    )
    p.add_argument(
        "--predictor",
        choices=PREDICTORS,
        default=None,
        help="how ranks predict each bubble's end: min (FreeRide's minimum of the slot's last "
        "five, default), feedback (a percentile moved by its misses), peers (the end the "
        "neighbour it waits for published; ranks on the host clock)",
    )
    p.add_argument(
        "--outlived",
        choices=OUTLIVED,
        default=None,
        help="what a side task does once a bubble outlives its predicted end: stop (default, "
        "FreeRide's), survivors (go on while the slot's longer bubbles say a step fits), "
        "hand-on (as survivors, leaving that time to the stage's leftovers task)",
    )


_CONFIG_OPTIONS = (
    "schedule", "stages", "microbatches", "chunks", "steps", "workload", "device", "layers",
    "d_model", "seq_len", "microbatch_size", "seed", "nnodes", "node_rank", "master_addr",
    "master_port", "t_forward_ms", "t_backward_input_ms", "t_backward_weight_ms", "side_tasks",
)  # fmt: skip
_RUNTIME_OPTIONS = ("predictor", "outlived")  # RuntimeOptions fields
_MPS = {"auto": None, "on": True, "off": False}


def run_config_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The ``RunConfig`` fields that ``add_run_options`` arguments set."""
    given = {k: getattr(args, k) for k in _CONFIG_OPTIONS if getattr(args, k, None) is not None}
    if _MPS.get(getattr(args, "mps", "auto")) is not None:
        given["mps"] = _MPS[args.mps]
    runtime = {k: getattr(args, k) for k in _RUNTIME_OPTIONS if getattr(args, k, None) is not None}
    if runtime:
        given["runtime"] = runtime
    return given


def cmd_run(args: argparse.Namespace) -> int:
    """Launch, follow with a progress bar, print the bubble tables and the run directory."""
    from freeride_lab.core.config import RunConfig
    from freeride_lab.lab.session import Session

    if not (math.isfinite(args.min_bubble_ms) and args.min_bubble_ms >= 0):
        raise UsageError(f"--min-bubble-ms={args.min_bubble_ms!r} must be a finite number >= 0")
    try:
        config = RunConfig(**run_config_fields(args))
        session = Session.launch(config, run_dir=args.run_dir, grace_s=args.grace_s)
    except OSError as e:
        raise UsageError(os_error_text(e)) from None
    except (ValueError, TypeError, RuntimeError) as e:
        raise UsageError(str(e)) from None
    session.bubble_min_ms = args.min_bubble_ms
    print(f"run {session.run_id} in {session.run_dir.path}", file=sys.stderr)
    try:
        _follow(session, progress=not args.no_progress)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup
        print(
            f"{PROG}: interrupted; stopping the run (up to {session.grace_s:g} s)", file=sys.stderr
        )
        session.stop()
        print(f"stopped after {session.steps_done} step(s); run directory: {session.run_dir.path}")
        return EXIT_INTERRUPTED
    finally:
        session.stop()
    return _report(session)


def os_error_text(e: OSError) -> str:
    """``e`` for a person: its message and the path it names, without the "[Errno N]" prefix."""
    text = str(e.strerror or "").strip() or str(e)
    for name in (e.filename, e.filename2):
        if name is not None and str(name) not in text:
            text = f"{text}: {name}"
    return text


def _follow(session: Session, *, progress: bool) -> None:
    from tqdm import tqdm

    # disable=None: tqdm draws only on a terminal; a log file gets no bar lines.
    with tqdm(
        total=session.config.steps,
        unit="step",
        disable=True if not progress else None,
        file=sys.stderr,
        leave=True,
    ) as bar:
        while True:
            try:
                session.wait(timeout_s=0.5)
                break
            except TimeoutError:
                pass
            if session.steps_done > bar.n:
                bar.update(session.steps_done - bar.n)
        bar.update(max(0, session.steps_done - bar.n))


def _report(session: Session) -> int:
    """Print the per-rank tables; returns the exit code for the run's final state."""
    import pandas as pd

    state = session.state
    failure = session.failure
    if failure is not None:
        print(f"run {state}: {failure.reason}", file=sys.stderr)
    actions = session.actions
    cfg = session.config
    if actions.empty:
        print(f"run {state}: no actions were recorded")
    else:
        steps = sorted(actions["step"].unique())
        skip = 1 if len(steps) > 1 else 0
        kept = steps[skip:]
        bubbles = session.bubbles
        bubbles = bubbles[bubbles["step"].isin(kept)]
        per_kind = bubbles.pivot_table(
            index=["rank", "stage"], columns="kind", values="duration_ms", aggfunc="sum"
        ).reindex(columns=["warmup", "steady", "cooldown", "end", "boundary"])
        per_kind = per_kind.fillna(0.0) / len(kept)
        per_kind["total_ms"] = per_kind.sum(axis=1)
        per_kind["n_bubbles"] = bubbles.groupby(["rank", "stage"]).size() / len(kept)
        first = ", step 0 left out as warm-up" if skip else ""
        print(f"\nBubbles per rank: mean ms per step over {len(kept)} step(s){first}")
        print(per_kind.reset_index().to_string(index=False, float_format=lambda x: f"{x:.1f}"))
        summary = session.summary()
        summary = summary.assign(
            measured_pct=summary["measured_frac"] * 100, theory_pct=summary["theory_frac"] * 100
        )
        split = {f"{part}_ms_per_step": f"{part}_ms" for part in ("schedule", "peer", "host")}
        shown = ["rank", "stage", "measured_pct", "theory_pct", "delta_pts", "largest_gap_ms"]
        summary = summary.rename(columns=split)[[*shown, *split.values()]]
        shape = f"{cfg.schedule}, S={cfg.stages}, M={cfg.microbatches}, V={cfg.chunks}"
        print(f"\nMeasured vs theory bubble fraction ({shape})")
        print(
            "why above theory, ms per step: schedule_ms = idle the schedule leaves with this "
            "run's costs, peer_ms = waiting on another rank, host_ms = this rank's overhead"
        )
        with pd.option_context("display.width", 160):
            print(summary.to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    print(f"\nrun {state} after {session.steps_done}/{cfg.steps} steps")
    print(f"run directory: {session.run_dir.path}")
    return EXIT_OK if state == "finished" else EXIT_FAILED


# -- simulate ------------------------------------------------------------------------------------


def add_simulate(subparsers: Any) -> argparse.ArgumentParser:
    """``simulate``: the planner's per-rank idle time for a schedule, next to theory."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="simulate a schedule from action costs (no processes)",
        description="Run the discrete-event planner for one step and print each rank's busy "
        "and idle time next to the analytic bubble fraction.",
    )
    _add_shape_options(p)
    p.add_argument("--comm-ms", type=float, default=0.0, help="added to cross-rank dependencies")
    p.add_argument("--dispatch-ms", type=float, default=0.0, help="spent before each action")
    return p


def cmd_simulate(args: argparse.Namespace) -> int:
    """Print ``simulate_summary`` with a ``theory_pct`` column.

    Costs mean what they mean for ``run`` (``Costs.from_config``), so the table predicts the
    synthetic run of the same options; theory takes the mean cost of a stage chunk.
    """
    import math

    from freeride_lab.core.config import COST_FIELDS, RunConfig
    from freeride_lab.core.plan import Costs, simulate_summary
    from freeride_lab.core.schedule import Schedule
    from freeride_lab.core.theory import NO_FORMULA, theory_bubble_fraction

    costs_given = {
        name: 1.0 if getattr(args, name) is None else getattr(args, name) for name in COST_FIELDS
    }
    try:
        spec = Schedule.from_name(args.schedule)
        # the bounds a run is held to (sizes, stage chunks, costs); no plan is built twice
        config = RunConfig(schedule=spec.name, stages=args.stages, microbatches=args.microbatches,
                           chunks=args.chunks, workload="synthetic", check_plan=False,
                           **costs_given)  # fmt: skip
        costs = Costs.from_config(config, comm_ms=args.comm_ms, dispatch_ms=args.dispatch_ms)
        table = simulate_summary(spec, args.stages, args.microbatches, args.chunks, costs=costs)
        t_f, t_i, t_w = (
            float(sum(col) / len(col)) for col in zip(*config.stage_costs_ms(), strict=True)
        )
        theory = (
            math.nan
            if spec.name in NO_FORMULA
            else theory_bubble_fraction(
                spec.name,
                args.stages,
                args.microbatches,
                args.chunks,
                t_forward=t_f,
                t_backward_input=t_i,
                t_backward_weight=t_w,
            )
        )
    except (ValueError, TypeError) as e:
        raise UsageError(str(e)) from None
    table = table.assign(idle_pct=table["idle_frac"] * 100, theory_pct=theory * 100)
    table = table.drop(columns=["idle_frac"])
    v = spec.resolve_chunks(args.chunks)
    print(f"{spec.name}, S={args.stages}, M={args.microbatches}, V={v}: one step, costs in ms")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    return EXIT_OK


if __name__ == "__main__":
    # Run the imported module's main, so that handlers and this block share one UsageError.
    from freeride_lab.cli.app import main as _main

    sys.exit(_main())
