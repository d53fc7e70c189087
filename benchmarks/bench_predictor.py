"""How well each bubble predictor plans for the bubbles a real pipeline leaves, replayed offline.

A rank predicts each bubble's length when the bubble starts (``RuntimeOptions.predictor``); a
side task plans its steps to that prediction. This benchmark takes the bubbles that runs
really measured (``Session.bubbles``: every rank's idle gaps, slot by slot, step by step),
replays each predictor over them in the order the rank met them, and scores every prediction
against the length it was made for (``core.bubble_prediction``):

- *planned*: min(prediction, length) over the idle time: what a task could plan steps for;
- *over*: max(0, prediction - length) over the idle time: how far predictions promised more
  than the bubbles held (a step planned to the prediction runs that far into compute);
- *missed*: the share of bubbles shorter than their prediction.

"peers" ([Note: awaited peer] in ``core.peer_prediction``) also reads, for each bubble, the end
the rank's awaited peer would have published for the action that ends the bubble: the peer's
start of that action (from the run's timed actions, where it came before the bubble began and
is still among the peer's last ``ENTRIES`` starts) plus the lower median of its last 16
actions of that stage and kind in earlier steps, as ``ActionRecorder`` publishes it. Every
predictor here learns bubble by bubble, a rank step by step. "peers-p10" adds the 10th
percentile of the slot's hand-overs instead of the least. "peers-told" also lets the side task
read a peer's end that comes mid-bubble (``sidetasks.host.iterative`` [Note: told
mid-bubble]): where a bubble that began before its peer started the action outlives its
prediction and the peer then starts it, the time from the later of the two to the peer's end
plus the hand-over counts as planned, and the told end as the bubble's end planned to (over and
missed from it); a side task's guard and the host's own latency are not modelled. They need a
run whose every rank timed its actions (the emulated pipeline's sleeping peers do).

Each figure is computed per block of consecutive steps (``--blocks``, at least 5), and the
difference of each predictor from FreeRide's minimum of five is the mean of the paired
per-block differences with its 95% t-interval (``core.intervals.mean_interval``). The same
predictor instance runs through all blocks, as on a rank.

Runs: the text workload (a small byte-level GPT, every action computed) on the CPU, one run
per schedule; or the runs in ``--run-dirs`` (a GPU run's directory, say).

    python benchmarks/bench_predictor.py --steps 80 --out predictor.json
    python benchmarks/bench_predictor.py --run-dirs RUN_DIR [RUN_DIR ...] --out predictor.json
"""

from __future__ import annotations

import argparse
import bisect
import math
import platform
import statistics
import tempfile
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from bench_output import command_line, cpu_model, write_results

from freeride_lab.core.bubble_prediction import FeedbackSlotPredictor, Predictor, predictions
from freeride_lab.core.bubbles import SlotPredictor
from freeride_lab.core.config import RunConfig
from freeride_lab.core.intervals import mean_interval
from freeride_lab.core.peer_prediction import AwaitedPeerPredictor
from freeride_lab.core.schedule import Action, feeding_stage
from freeride_lab.io.peer_board import ENTRIES
from freeride_lab.lab.session import Session

#: The predictors compared; "min-of-5" is the reference (FreeRide's, the runtime's default).
PREDICTORS: dict[str, Callable[[], Predictor]] = {
    "min-of-5": lambda: SlotPredictor(k=5, method="min"),
    "p10-of-16": lambda: SlotPredictor(k=16, method="percentile", q=10.0),
    "feedback": lambda: FeedbackSlotPredictor(),
}
#: Predictors that read the end the awaited peer published, where the run has every rank's
#: actions (``replay_run``'s ``actions``).
PEER_PREDICTORS: dict[str, Callable[[], AwaitedPeerPredictor]] = {
    "peers": lambda: AwaitedPeerPredictor(SlotPredictor(k=5, method="min")),
    "peers-p10": lambda: AwaitedPeerPredictor(SlotPredictor(k=5, method="min"), q=10.0),
    "peers-told": lambda: AwaitedPeerPredictor(SlotPredictor(k=5, method="min")),
}
#: Peer predictors whose side task also reads a peer's end that comes mid-bubble.
TOLD = {"peers-told"}
REFERENCE = "min-of-5"
#: one shape per schedule: (S, M, V)
SHAPES: dict[str, tuple[int, int, int]] = {
    "1F1B": (4, 8, 1),
    "Interleaved1F1B": (4, 8, 2),
    "InterleavedZeroBubble": (4, 8, 2),
}
FIGURES = ("planned_frac", "over_frac", "miss_frac")


def cpu_run(schedule: str, *, steps: int, root: Path) -> Path:
    """One CPU run of the text workload; its run directory."""
    stages, microbatches, chunks = SHAPES[schedule]
    config = RunConfig(
        schedule=schedule, stages=stages, microbatches=microbatches, chunks=chunks, steps=steps,
        workload="text", layers=2 * stages * chunks, d_model=64, heads=2, seq_len=64,
        microbatch_size=4, side_tasks=False,
        run_dir=str(root / f"{schedule}-{int(time.time())}"),
    )  # fmt: skip
    session = Session.launch(config, grace_s=20.0)
    try:
        session.wait(timeout_s=900)
    finally:
        session.stop()  # a run that hung or failed leaves nothing running
    return Path(config.run_dir)


def replay_run(
    bubbles: pd.DataFrame,
    *,
    skip: int,
    blocks: int,
    actions: pd.DataFrame | None = None,
    scored_ms: tuple[float, float] = (0.0, math.inf),
) -> dict[str, Any]:
    """Every predictor over one run's bubbles, rank by rank; figures per block of steps and
    each predictor's paired difference from the reference. With the run's ``actions``
    (``Session.actions``) the peer predictors too. Only bubbles whose length lies within
    ``scored_ms`` are scored; every predictor learns from all of them, as a rank does."""
    steps = sorted(int(s) for s in bubbles["step"].unique() if s >= skip)
    if len(steps) < blocks:
        raise ValueError(f"{len(steps)} measured steps cannot make {blocks} blocks")
    block_of = {s: i * blocks // len(steps) for i, s in enumerate(steps)}
    low, high = (ms * 1e6 for ms in scored_ms)
    per_block: dict[str, list[dict[str, float]]] = {}
    feeders = feeder_actions(bubbles, actions) if actions is not None else None
    ends = published_ends(bubbles, actions, feeders) if actions is not None else None
    makers: dict[str, Callable[[], Any]] = dict(PREDICTORS)
    if ends is not None:
        makers.update(PEER_PREDICTORS)
    told = scored = 0  # scored bubbles, and those whose awaited peer had published an end
    for name, make in makers.items():
        rows: list[tuple[int, Outcome | None, int]] = []  # (block, outcome, length)
        for _, mine in bubbles.sort_values(["rank", "step", "start_ms"]).groupby("rank"):
            lengths = zip(mine["slot"], mine["duration_ms"], strict=True)
            trace = [(int(slot), round(ms * 1e6)) for slot, ms in lengths]
            if name in PEER_PREDICTORS:
                assert ends is not None and feeders is not None
                starts = [round(ms * 1e6) for ms in mine["start_ms"]]
                peer = [ends.get(i) for i in mine.index]
                closing = [feeders[i][2] if i in feeders else None for i in mine.index]
                late = [feeders[i][1:] if name in TOLD and i in feeders else None
                        for i in mine.index]  # fmt: skip
                outcomes = peer_outcomes(make(), trace, starts, peer, closing, late)
            else:  # one predictor per rank, as on a rank
                predicted = predictions(make(), trace)
                outcomes = [outcome(p, n) for p, (_, n) in zip(predicted, trace, strict=True)]
            for i, step, o, (_, length) in zip(
                mine.index, mine["step"], outcomes, trace, strict=True
            ):
                if int(step) in block_of and low <= length <= high:
                    rows.append((block_of[int(step)], o, length))
                    if name == REFERENCE and ends is not None:
                        scored += 1
                        told += i in ends
        per_block[name] = [
            _figures([(o, n) for b, o, n in rows if b == block]) for block in range(blocks)
        ]
    out: dict[str, Any] = {"steps_measured": len(steps), "blocks": blocks, "predictors": {}}
    if ends is not None:  # the share of the scored bubbles a peer predictor had a peer's end for
        out["with_peer_end"] = told / scored if scored else math.nan
    for name, figures in per_block.items():
        entry: dict[str, Any] = {}
        for fig in FIGURES:
            values = [f[fig] for f in figures]
            entry[fig] = mean_interval(values).record()
            if name != REFERENCE:
                ref = [f[fig] for f in per_block[REFERENCE]]
                entry[f"{fig}_vs_{REFERENCE}"] = mean_interval(
                    [a - b for a, b in zip(values, ref, strict=True)]
                ).record()
        entry["bubbles"] = sum(f["bubbles"] for f in figures)
        out["predictors"][name] = entry
    return out


#: What a prediction let a task do in one bubble: (time planned for, time promised past the
#: bubble's end, whether the bubble ended before the end planned to), ns.
Outcome = tuple[int, int, bool]


def outcome(predicted: int | None, length: int) -> Outcome | None:
    """A bubble of ``length`` planned to ``predicted`` (None: it could not be planned)."""
    if predicted is None:
        return None
    return (min(predicted, length), max(0, predicted - length), predicted > length)


def peer_outcomes(
    predictor: AwaitedPeerPredictor,
    trace: Sequence[tuple[int, int]],
    starts: Sequence[int],
    peer_ends: Sequence[int | None],
    closing_ends: Sequence[int | None],
    late: Sequence[tuple[int, int] | None],
) -> list[Outcome | None]:
    """Each bubble (slot, length) that began at ``starts[i]``, predicted from ``peer_ends[i]``
    before its length is learnt, and its hand-over from the peer's end read at its close,
    ``closing_ends[i]``, where none was published at its start (as a rank does). Where
    ``late[i]`` gives the awaited action's (start, expected
    end) and no end was published at the bubble's start, the side task reads it once the
    action has started, if the bubble is still open past its prediction
    (``sidetasks.host.iterative`` [Note: told mid-bubble]): from the later of the prediction
    and that start, it plans to the published end plus the slot's hand-over."""
    out = []
    rows = zip(trace, starts, peer_ends, closing_ends, late, strict=True)
    for (slot, length), start, peer_end, closing_end, feeder in rows:
        predicted = predictor.predict_from_peer(slot, start, peer_end)
        hand_over = predictor.hand_over(slot)
        result = outcome(predicted, length)
        if result is not None and peer_end is None and feeder is not None and hand_over is not None:
            assert predicted is not None
            began, expected = feeder
            told, end, planned_to = expected + hand_over, start + length, start + predicted
            if start < began < end and planned_to < min(told, end):
                planned = predicted + max(0, min(told, end) - max(began, planned_to))
                result = (planned, max(0, told - end), told > end)
        out.append(result)
        predictor.observe(slot, length)
        learnt_from = peer_end if peer_end is not None else closing_end
        if learnt_from is not None:
            predictor.observe_peer(slot, start + length, learnt_from)
    return out


def feeder_actions(bubbles: pd.DataFrame, actions: pd.DataFrame) -> dict[Any, tuple[int, int, int]]:
    """Per bubble (``bubbles``' index), the action of another rank whose output ends it, as
    (that rank, the action's start, the end its rank would have published: the start plus the
    lower median of its last 16 actions of that stage and kind in earlier steps), run-clock
    ms x 1e6 as the bubbles' starts; bubbles without one (no awaited peer, no earlier action of
    its stage and kind to take a median from) are left out."""
    rank_of = actions.groupby("stage")["rank"].first().to_dict()
    kinds = {"F": "F", "B": "B", "I": "B", "W": "W"}  # a backward is found as B or I
    feeder: dict[tuple[int, int, str, int], tuple[int, int]] = {}  # -> (start, expected end)
    past: dict[tuple[int, str], deque[int]] = defaultdict(lambda: deque(maxlen=16))
    ordered = actions.sort_values(["step", "start_ms"])
    for step, rows in ordered.groupby("step", sort=True):
        for r in rows.itertuples():
            start = round(r.start_ms * 1e6)
            durations = past[(r.stage, r.action)]
            if durations:
                expected = start + round(statistics.median_low(durations))
                feeder[(int(step), r.stage, kinds[r.action], r.microbatch)] = (start, expected)
        for r in rows.itertuples():  # learnt once the step is over, as a rank does
            past[(r.stage, r.action)].append(round(r.duration_ms * 1e6))
    mine: dict[tuple[int, str], list[tuple[float, int]]] = defaultdict(list)
    for r in actions.itertuples():
        mine[(r.rank, f"{r.stage}{r.action}{r.microbatch}")].append((r.start_ms, int(r.step)))
    for entries in mine.values():
        entries.sort()
    out: dict[Any, tuple[int, int, int]] = {}
    for i, b in zip(bubbles.index, bubbles.itertuples(), strict=True):
        try:
            action = Action.parse(str(b.before))
        except ValueError:
            continue  # the window's end, the optimizer: no action of a peer ends it
        source = feeding_stage(action.stage, action.kind)
        rank = None if source is None else rank_of.get(source)
        if source is None or rank is None or rank == b.rank:
            continue
        entries = mine.get((b.rank, str(b.before)), [])
        at = bisect.bisect_left(entries, (b.end_ms - 1e-6, -1))  # the action the bubble ends at
        if at == len(entries):
            continue
        key = (entries[at][1], source, kinds[action.kind.value], action.microbatch)
        if key in feeder:
            out[i] = (rank, *feeder[key])
    return out


def published_ends(
    bubbles: pd.DataFrame,
    actions: pd.DataFrame,
    feeders: dict[Any, tuple[int, int, int]] | None = None,
) -> dict[Any, int]:
    """Per bubble, the end its awaited peer had published when it began (``feeder_actions``,
    computed here unless given): where the peer started the action before the bubble began
    and had started no more than ``ENTRIES`` actions since."""
    if feeders is None:
        feeders = feeder_actions(bubbles, actions)
    starts_of = {
        rank: sorted(round(ms * 1e6) for ms in rows["start_ms"])
        for rank, rows in actions.groupby("rank")
    }
    out: dict[Any, int] = {}
    for i, b in zip(bubbles.index, bubbles.itertuples(), strict=True):
        if i not in feeders:
            continue
        rank, start, expected = feeders[i]
        t0 = round(b.start_ms * 1e6)
        feeder_starts = starts_of[rank]
        kept = bisect.bisect_right(feeder_starts, t0) - bisect.bisect_left(feeder_starts, start)
        if start <= t0 and kept <= ENTRIES:
            out[i] = expected
    return out


def _figures(rows: Sequence[tuple[Outcome | None, int]]) -> dict[str, float]:
    """Planned, over and missed of a block's bubbles (those that could be planned)."""
    done = [(o, n) for o, n in rows if o is not None]
    idle = sum(n for _, n in done)
    return {
        "planned_frac": sum(o[0] for o, _ in done) / idle if idle else math.nan,
        "over_frac": sum(o[1] for o, _ in done) / idle if idle else math.nan,
        "miss_frac": sum(o[2] for o, _ in done) / len(done) if done else math.nan,
        "bubbles": len(done),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedules", default=",".join(SHAPES),
                    help=f"CPU runs, comma list of {', '.join(SHAPES)}")  # fmt: skip
    ap.add_argument("--run-dirs", type=Path, nargs="*", default=None,
                    help="replay these runs instead of running the CPU ones")  # fmt: skip
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--skip", type=int, default=5, help="leading steps left out (warm-up)")
    ap.add_argument("--blocks", type=int, default=8, help="blocks of steps (at least 5)")
    ap.add_argument("--shortest-ms", type=float, default=0.0,
                    help="score only bubbles at least this long (ranks announce 1 ms)")  # fmt: skip
    ap.add_argument("--longest-ms", type=float, default=math.inf,
                    help="score only bubbles at most this long (the bench's pauses are longer "
                    "than 1000 ms)")  # fmt: skip
    ap.add_argument("--by-rank", action="store_true", help="also score each rank alone")
    ap.add_argument("--run-root", type=Path, default=None)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.blocks < 5:
        ap.error(f"--blocks {args.blocks}: the intervals need at least 5 blocks")
    if args.run_dirs:
        runs = [(path.name, path) for path in args.run_dirs]
    else:
        unknown = [s for s in args.schedules.split(",") if s not in SHAPES]
        if unknown:
            ap.error(f"--schedules: unknown {unknown}; valid: {', '.join(SHAPES)}")
        root = args.run_root or Path(tempfile.mkdtemp(prefix="predictor-"))
        runs = [(s, cpu_run(s, steps=args.steps, root=root)) for s in args.schedules.split(",")]
    results = []
    scored = (args.shortest_ms, args.longest_ms)
    for label, path in runs:
        session = Session.open(path)
        bubbles, actions = session.bubbles, session.actions
        r = {"run": label, **replay_run(bubbles, skip=args.skip, blocks=args.blocks,
                                        actions=actions, scored_ms=scored)}  # fmt: skip
        if args.by_rank:
            r["ranks"] = {
                str(rank): replay_run(
                    mine, skip=args.skip, blocks=args.blocks, actions=actions, scored_ms=scored
                )
                for rank, mine in bubbles.groupby("rank")
            }
        results.append(r)
        for who, out in [
            ("all ranks", r),
            *((f"rank {k}", v) for k, v in r.get("ranks", {}).items()),
        ]:
            for name, e in out["predictors"].items():
                print(f"{label} {who} {name}: planned {e['planned_frac']['value']:.1%}, over "
                      f"{e['over_frac']['value']:.2%}, missed {e['miss_frac']['value']:.1%}",
                      flush=True)  # fmt: skip
    record = {
        "benchmark": "predictor",
        "command": command_line(),
        "date": time.strftime("%Y-%m-%d"),
        "machine": {
            "platform": platform.platform(),
            "cpu": cpu_model(),
            "device": "cpu" if not args.run_dirs else "as recorded",
        },
        "reference": REFERENCE,
        "scored_ms": [
            args.shortest_ms,
            args.longest_ms if math.isfinite(args.longest_ms) else None,
        ],
        "runs": results,
    }
    write_results(record, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
