"""Write BENCHMARKS.md's tables, and the ``.md`` beside each bench result, from the committed JSON.

Every table of BENCHMARKS.md sits between ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->``
and is computed here from ``benchmarks/results/*.json`` with the package's own arithmetic
(``bench.results.fill_tables``), so no number in a table is typed by hand and an old
result is read with today's arithmetic. What an old result did not record (the solo phase
after the blocks, the task's own overrun count) is written "not measured in this result".

Run from the repository root with the package importable (``pip install -e .`` or
``PYTHONPATH=.``)::

    python benchmarks/make_tables.py            # rewrite the tables in place
    python benchmarks/make_tables.py --check    # exit 1 naming every stale table or .md file

Over 500 lines: one builder per table of BENCHMARKS.md, each beside the constants naming its result
files.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import statistics
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from goal_status import Source, goal_table
from harvest_ceiling import ARMS as CEILING_ARMS
from harvest_ceiling import BEYOND, COSTS, OVERRUN, gaps_ms, steps_by_task
from lever_status import (
    Arm,
    Comparison,
    bench_comparisons,
    lever_table,
    paired_comparison,
    pipeline_comparisons,
    placement_comparisons,
)

from freeride_lab.bench.markdown import (
    NOT_MEASURED,
    PLACEMENT_HEADERS,
    SPIN_COLUMNS,
    SPIN_HEADERS,
    TAIL_PAST,
    UNUSED_WHY,
    fmt_frac_interval,
    fmt_interval,
    fmt_ms_interval,
    fmt_num,
    fmt_pct,
    fmt_rate,
    fmt_throughput,
    goal_figure,
    markdown,
    md_table,
    placement_cells,
    recorded,
    run_label,
    spin_cells,
)
from freeride_lab.bench.placement import predicted_fill_ms
from freeride_lab.bench.results import fill_tables, segment_tasks
from freeride_lab.bench.stats import GATED_MODES, side_work
from freeride_lab.core.budget import sized_budget_ns
from freeride_lab.core.intervals import Interval, mean_interval
from freeride_lab.sidetasks.api import doubling_sizes

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "BENCHMARKS.md"

#: The H200 results BENCHMARKS.md reports (the r4 calls of 2026-12-03).
H200_M4 = "h200-2026-12-03-m4-timeslice-m4-mps-r4.json"
H200_M8 = "h200-2026-12-03-m8-timeslice-r4.json"
#: The H200 re-run of 2026-12-04 with per-run dedicated speeds and intervals: one M = 4
#: time-sliced run measured in two calls (real stages 0-1, then 2-3), read as one result.
H200_SPLIT = ("h200-2026-12-04-m4-timeslice-s01.json", "h200-2026-12-04-m4-timeslice-s23.json")
#: The same M = 4 time-sliced run with the instrument off the training path (true plain
#: baseline, host stop agreement, steps read off the device lazily) and the idle between steps
#: counted as bubbles; all four stages real, in one call.
H200_INSTRUMENT = "h200-2026-12-04-m4-timeslice-instrument.json"
#: What timing every action costs a CUDA rank (benchmarks/bench_timing_overhead.py), today's
#: instrument ("new") and the one before it ("old"), alternating calls on one H200.
TIMING_OVERHEAD = tuple(
    f"timing-overhead-h200-2026-12-04-{code}-{i}.json" for i in (1, 2) for code in ("new", "old")
)
#: The same benchmark with quiet slots (only bubbles predicted >= 1 ms announced live), on a
#: launch-bound and a compute-bound one-stage GPT, each with every slot announced beside it.
TIMING_OVERHEAD_C = tuple(
    f"timing-overhead-h200-2026-12-04c-{model}-announce{ms}.json"
    for model in ("launch", "compute")
    for ms in (1, 0)
)
#: The launch-bound row again, in a later call, after stamp events are recycled with live
#: edges on (a different machine allocation: compare within a call only).
TIMING_OVERHEAD_D = "timing-overhead-h200-2026-12-04d-launch-reuse.json"
#: What timing every action costs a CPU rank, today's instrument (bench_timing_overhead.py):
#: both cases in one call, then the synthetic case alone with more block pairs.
TIMING_OVERHEAD_CPU = (
    "timing-overhead-cpu-2026-12-04.json",
    "timing-overhead-cpu-2026-12-04-synthetic.json",
)
#: How far above theory real synthetic pipelines sit by action length, and why (CPU,
#: bench_fidelity.py: one shape per schedule, 2, 10 and 50 ms actions).
FIDELITY_CPU = "fidelity-cpu-2026-12-04.json"
#: Bubble predictors replayed over CPU runs' bubbles (benchmarks/bench_predictor.py).
PREDICTOR_CPU = "predictor-cpu-2026-12-05.json"
#: The awaited peer's published end against the slot predictors, replayed over CPU runs whose
#: every rank timed its actions (benchmarks/bench_predictor.py --by-rank).
PREDICTOR_PEERS_CPU = "predictor-peers-cpu-2026-12-08.json"
#: Step sizes against one slice a step, replayed on the CPU over the bubbles of the H100's
#: stage 1 and 3 (benchmarks/bench_step_sizes.py): (file, task, the host's policy).
#: The boundary bubble opened before or after the rank writes the step's events: the tree
#: before the change (c4c2330) and after it (7c7a65e), alternating, one CPU shell session.
BOUNDARY_CPU = (
    ("cpu-2026-12-05-boundary-before-1.json", "before: opened after the writing (c4c2330)"),
    ("cpu-2026-12-05-boundary-after-1.json", "after: opened before it (7c7a65e)"),
    ("cpu-2026-12-05-boundary-before-2.json", "before: opened after the writing (c4c2330)"),
    ("cpu-2026-12-05-boundary-after-2.json", "after: opened before it (7c7a65e)"),
)
#: Bubble-start latency of a spinning reader (bench_edge_latency.py), the package tree before
#: the precise sleep and the spin window (2c131c0) and after them (69374cd), alternating, one
#: CPU shell session: (file, tree).
EDGE_LATENCY_CPU = tuple(
    (f"edge-latency-cpu-2026-12-05-{arm}-{n}.json", label)
    for n in (1, 2)
    for arm, label in (("before", "before (2c131c0)"), ("after", "after (69374cd)"))
)
#: The task host's own path, edge → step() (bench_host_path.py), the package tree before the
#: host's path was trimmed (2c131c0) and after (706c8d3), alternating, one CPU shell session.
HOST_PATH_CPU = tuple(
    (f"host-path-cpu-2026-12-05-{arm}-{n}.json", label)
    for n in (1, 2)
    for arm, label in (("before", "before (2c131c0)"), ("after", "after (706c8d3)"))
)
#: The same path before and after the reader stopped draining its FIFO ahead of a new edge
#: (bench_host_path.py with p99 and the share over 1 ms; alternating, three rounds).
HOST_PATH_TAIL_CPU = tuple(
    (f"host-path-cpu-2026-12-06-{arm}-{n}.json", label)
    for n in (1, 2, 3)
    for arm, label in (("before", "before (47593ff)"), ("after", "after (175adda)"))
)
#: The host's path between two steps (bench_host_path.py's between-steps phase) with the overrun
#: check through numpy (6b5f89a) and in plain Python (c5417ea); alternating, three rounds.
HOST_PATH_BETWEEN_CPU = tuple(
    (f"host-path-cpu-2026-12-07-{arm}-{n}.json", label)
    for n in (1, 2, 3)
    for arm, label in (("before", "before (6b5f89a)"), ("after", "after (c5417ea)"))
)
STEP_SIZES_CPU = (
    ("step-sizes-cpu-2026-12-05-resnet18-cb1819b.json", "resnet18",
     "as on the H100 (cb1819b): a bubble's next step no larger than its last"),
    ("step-sizes-cpu-2026-12-05-resnet18.json", "resnet18",
     "today's: a size too large for the remainder stays out"),
    ("step-sizes-cpu-2026-12-05-vgg19.json", "vgg19",
     "today's: a size too large for the remainder stays out"),
)  # fmt: skip
#: Past a bubble's predicted end, the survivors against stopping, replayed over the bubbles the
#: evening's two H100 calls announced (bench_outlived.py): their runs, by which arm ran them.
OUTLIVED_REPLAY = "outlived-h100-2026-12-06d.json"
OUTLIVED_RUNS = ("minimum of five", "feedback predictor", "survivors (second call)",
                 "stop (second call)")  # fmt: skip
OUTLIVED_TASKS = {0: "pagerank", 2: "image"}
#: The same over the zero-bubble run of 12-07f's graphed arm (every stage, the image task on
#: the leftovers of stages 0, 1 and 3), guarded as the image task's steps were at a bubble's
#: entry: what planning its steps to the survivors could add on each stage.
OUTLIVED_REPLAY_ZB = "outlived-h100-2026-12-07f-zb.json"
OUTLIVED_ZB_RUNS = ("zero-bubble, band step graphed",)
OUTLIVED_MIX_TASKS = {0: "pagerank + image", 1: "resnet18 + image", 2: "image",
                     3: "vgg19 + image"}  # fmt: skip
#: the same replay over the bubbles of 2026-12-08's every-stage call at M = 8 (each rank's from
#: the segment it ran real), each rank on its image task's guard at entry
OUTLIVED_REPLAY_M8 = "outlived-h100-2026-12-08-m8.json"
OUTLIVED_M8_RUNS = ("M = 8, every stage",)
OUTLIVED_SHARES = {"survivors 0": "the survivors' minimum", "survivors 0.1": "1 in 10 set aside",
                   "survivors 0.2": "1 in 5 set aside (the default)",
                   "survivors 0.34": "1 in 3 set aside"}  # fmt: skip
#: The CUDA edge watcher's sleeping wait against the old polling one (bench_edge_watcher.py).
EDGE_WATCHER = "edge-watcher-h200-2026-12-04.json"
#: The M = 4 time-sliced run of the restructured tree (quiet slots, pipe wake-ups, one governor
#: loop), real stages 0-2 (stage 3's VGG-19 segment did not fit the call's time budget).
H200_MERGED = "h200-2026-12-04-m4-timeslice-merged.json"
#: Stage 0 alone, every gap announced against the default 1 ms threshold, one call.
H200_ANNOUNCE = tuple(f"h200-2026-12-04-m4-timeslice-stage0-announce{a}.json" for a in (0, 1))
#: Where the idle time goes (core.idle_use), real stages 0-1 in one call and 2-3 in a later one
#: (with step groups on and priority preemption in the tree by then); then two levers, each
#: against itself switched off within one call: step groups on stage 0 (PageRank's 0.2 ms steps)
#: and micro-batches on stage 1 (ResNet-18's 17 ms steps).
H200_IDLE_SPLIT = (
    ("h200-2026-12-04-idle-split-s01.json", "stages 0-1"),
    ("h200-2026-12-04-idle-split-s23.json", "stages 2-3"),
)
H200_LEVERS = (
    ("h200-2026-12-04-group0-s0.json", "step groups off"),
    ("h200-2026-12-04-group1-s0.json", "step groups 1 ms"),
    ("h200-2026-12-04-micro1-s1.json", "1 step per batch"),
    ("h200-2026-12-04-micro4-s1.json", "4 micro-batches"),
)
#: Trickle gating beside governed blocks (M = 4, under MPS): real stages 1 and 3 with five
#: 8-step blocks per mode, then stages 0 and 3 with eight.
H200_TRICKLE = (
    ("h200-2026-12-04-trickle-s13.json", "5 × 8 steps"),
    ("h200-2026-12-04-trickle-s03.json", "8 × 8 steps"),
)
#: The inference side task on stages 1 and 3 (M = 4, time-sliced), after its attention
#: stopped using cuDNN's kernels.
H200_INFERENCE = (("h200-2026-12-04-inference.json", "inference"),)
#: The same, once the task counted output tokens only (one call, the same command).
H200_INFERENCE_TOKENS = (("h200-2026-12-04-inference-output-tokens.json", "output tokens"),)
#: ResNet-18 on stage 1, then VGG-19 on stage 3 (M = 4, time-sliced): eager whole batches,
#: then slices of a batch replayed as CUDA graphs; per task, two bench invocations back to
#: back in one device call.
H200_GRAPHS = (
    ("h200-2026-12-04-graphs-eager.json", "whole batches, eager"),
    ("h200-2026-12-04-graphs-2slices.json", "2 graphed slices"),
    ("h200-2026-12-04-slices-vgg-eager.json", "whole batches, eager"),
    ("h200-2026-12-04-slices-vgg-4graphed.json", "4 graphed slices"),
)
#: The bench's new GPU defaults under MPS: stages 1 (ResNet-18, 2 graphed slices) and 3
#: (VGG-19, 4 graphed slices), one call.
H200_MPS_GRAPHS = (("h200-2026-12-04-mps-graphed-slices.json", "MPS, graphed slices"),)
#: Stage 1 (ResNet-18, 2 graphed slices) under two more schedules, S = 4, M = 4, V = 2,
#: time-sliced; one call, the two invocations back to back.
H200_SCHEDULES = (
    ("h200-2026-12-04-schedule-Interleaved1F1B.json", "Interleaved1F1B"),
    ("h200-2026-12-04-schedule-InterleavedZeroBubble.json", "InterleavedZeroBubble"),
)
#: Stage 1 (ResNet-18) and stage 2 (image) under InterleavedZeroBubble as the emulation's
#: peers changed: their whole backward in I (the call above), I and W calibrated and slept
#: apart, then every sleep run to a deadline (one call each).
H200_ZB_EMULATION = (
    ("h200-2026-12-04-schedule-InterleavedZeroBubble.json", "whole backward in I"),
    ("h200-2026-12-04-schedule-InterleavedZeroBubble-iw-split.json", "I and W apart"),
    ("h200-2026-12-04-schedule-InterleavedZeroBubble-deadline.json", "apart, to deadlines"),
)
#: Where an emulated pipeline's idle goes with no side task (benchmarks/bench_emulated_idle.py),
#: as the emulation's peers changed; a result without a recorded wire width used the quick
#: profile's 256.
EMULATED_IDLE = (
    ("emulated-idle-h200-2026-12-04-a-iw-split.json", "sleep on top of work"),
    ("emulated-idle-h200-2026-12-04-b-deadline.json", "sleep to a deadline"),
    ("emulated-idle-h200-2026-12-04-c-wires.json", "sleep to a deadline"),
)
#: The first result whose emulated peers last what they stand for (every sleep to a deadline):
#: an emulated-peer result recorded before it has the peers' overrun in its measured idle.
PEER_FIX = H200_ZB_EMULATION[-1][0]
#: The GPU task host's spin into a predicted bubble start, off then on: real stage 3 (VGG-19),
#: M = 4 time-sliced, two invocations back to back (before the step-boundary bubble).
H200_SPIN = (
    ("h200-2026-12-02-spin-off.json", "spin off"),
    ("h200-2026-12-02-spin-on.json", "spin on"),
)
#: The M = 4 time-sliced mix on an H100, the first run with peers that last what they stand
#: for and every stage real: stages 0 and 2 in one call (its stages 1 and 3 failed on a fault of
#: the graphed steps, fixed before the next call), stages 1 and 3 two calls later, one machine.
H100_HEADLINE = (
    ("h100-2026-12-05-headline-s02.json", "stages 0, 2"),
    ("h100-2026-12-05-headline-s13.json", "stages 1, 3"),
)
#: Lever 1 on that H100, the feedback predictor: stages 1 and 3 in the call of the headline's
#: stages 1 and 3 (after them), stages 0 and 2 in the next call.
H100_FEEDBACK = (
    ("h100-2026-12-05-feedback-s02.json", "feedback predictor, stages 0, 2"),
    ("h100-2026-12-05-feedback-s13.json", "feedback predictor, stages 1, 3"),
)
#: Lever 2 on that H100, step sizes: each vision task's batch in 4 graphed slices, a step taking
#: 1, 2 or 4 of them (``fit_slices``), stages 1 and 3, the call before the headline's.
H100_FIT_SLICES = (("h100-2026-12-05-fit-slices-s13.json", "1, 2 or 4 graphed slices a step"),)
#: M = 8 on that H100, every stage real in one call (time-sliced, vanilla and governed).
H100_M8 = (("h100-2026-12-05b-m8-all.json", "M = 8, governed"),)
#: InterleavedZeroBubble (chunks 2) on that H100, M = 4: stages 0-2 measured, stage 3 failed (a
#: training rank out of memory once the real stage had rotated over three ranks).
H100_ZB = (("h100-2026-12-05b-zb-all.json", "InterleavedZeroBubble, chunks 2"),)
#: Stage 3 of that schedule, a later call on another H100 (after ranks that stop computing give
#: their cached blocks back); read with the first as one run over the four stages.
H100_ZB_S3 = (("h100-2026-12-05c-zb-s3.json", "InterleavedZeroBubble, chunks 2, stage 3"),)
#: Lever 2 on an H100, step sizes, stages 1-3, both arms in one call (off first): the defaults
#: (each task's whole step: ResNet-18 and VGG-19 eager whole batches, the image task 16 bands a
#: band a step) against finer steps chosen per bubble (the vision tasks' batches as 4 graphed
#: slices, 1, 2 or 4 a step; the image task in 64 bands, 1, 2 or 4 a step).
H100_SIZES = (
    ("h100-2026-12-05c-sizes-off-s123.json", "whole steps"),
    ("h100-2026-12-05c-sizes-on-s123.json", "steps sized per bubble"),
)
#: Lever 7 on an H100 (stages 1-3, the task options of ``H100_SIZES``' on arm; one call, the
#: first arm first): hosts that sleep in ``select`` and spin over each slot's learned window,
#: against the same tree with ``FREERIDE_SPIN_LEAD_US=0`` (hosts never spin).
H100_SPIN = (
    ("h100-2026-12-05d-spin-on-s123.json", "spin into predicted starts"),
    ("h100-2026-12-05d-spin-off-s123.json", "hosts never spin"),
)
#: Lever 4 on that H100, the next call: governed blocks on stage 3 (VGG-19, the bench's default
#: options) with the governor's device signals off, then on; 8 repeats each.
H100_SIGNALS = (
    ("h100-2026-12-05d-signals-off-s3.json", "device signals off"),
    ("h100-2026-12-05d-signals-on-s3.json", "device signals on"),
)
#: The same call, before the signals: the vision tasks' batches in 8 graphed slices, 1, 2, 4 or
#: 8 a step (stage 3's VGG-19 segment did not fit the call's time budget).
H100_SLICES8 = (("h100-2026-12-05d-slices8-s123.json", "8 graphed slices"),)
#: M = 8 and InterleavedZeroBubble (chunks 2, stage 3, then stages 1-2 in the next call) with the
#: options of ``H100_SPIN``, the calls after it on the same machine.
H100_M8_SIZED = (("h100-2026-12-05d-m8-s123.json", "M = 8, sized steps"),)
H100_ZB_SIZED = (
    ("h100-2026-12-05d-zb-s3.json", "InterleavedZeroBubble, sized steps, stage 3"),
    ("h100-2026-12-05d-zb-s12.json", "InterleavedZeroBubble, sized steps, stages 1, 2"),
)
#: Everything the H100 calls of this tree measured, for the per-stage and idle tables.
H100_SPIN_TREE = (*H100_SPIN, *H100_SLICES8, *H100_M8_SIZED, *H100_ZB_SIZED)
#: The signal latency of those calls beside the evening's tree, whose host slept in ``poll``.
H100_LATENCY = ((H100_SIZES[1][0], "before: poll's sleep"), *H100_SPIN_TREE, *H100_SIGNALS)
_H100_IDLE = "table `h100-12-05-idle-split`"
#: The H100 calls of 2026-12-06, on the tree whose edge reader looks before it drains: the mix on
#: every stage at M = 4 (managed and governed) and M = 8 (governed), the options of
#: ``H100_SPIN``; then, on the same machine, M = 8 on stages 1-3 in finer steps (8 graphed
#: slices, the image task in 128 bands up to 8 a step) and M = 4 on stages 1-3 with the spin's
#: cap per bubble start at 4 ms (``FREERIDE_SPIN_MOST_US=4000``; default 2 ms).
H100_M4_ALL = ("h100-2026-12-06-m4-all.json", "M = 4, every stage")
H100_M8_ALL = ("h100-2026-12-06-m8-all.json", "M = 8, every stage")
H100_M8_FINE = ("h100-2026-12-06-m8-slices8-s123.json", "M = 8, 8 slices, 128 bands")
H100_SPIN4 = ("h100-2026-12-06-spin4ms-s123.json", "spin at most 4 ms")
#: Then, on another H100, stage 1 alone (governed): the tree as it is twice, and the same tree
#: with the edge reader draining its wake-up FIFO before every look, as before (source digest
#: d874e8ab; its result names the commit it was taken from).
H100_EDGE_FIRST = (
    ("h100-2026-12-06-edge-first-s1a.json", "edge first"),
    ("h100-2026-12-06-edge-first-s1b.json", "edge first, again"),
)
H100_DRAIN_FIRST = ("h100-2026-12-06-drain-first-s1.json", "drain first (before)")
H100_12_06 = (H100_M4_ALL, H100_SPIN4, H100_M8_ALL, H100_M8_FINE, *H100_EDGE_FIRST,
              H100_DRAIN_FIRST)  # fmt: skip
#: The later H100 calls of 2026-12-06, on the tree whose governor changes a limit only on
#: evidence (commit 11a6571, source digest 19d295e8; the results name the checkout's commit
#: before it, "+changes") and whose bench attaches one task per segment: ResNet-18 in 4 graphed
#: slices as before, VGG-19 in 8, the image task in 128 bands up to 8 a step. The mix on every
#: stage at M = 4 (managed, governed) and at M = 8 (governed); between them, on the same
#: machine, the governor's A/B on stages 1 and 3 (M = 4): its changes on the mean alone
#: (``--governor-evidence 0.5``) against on 95% evidence, two invocations of one call.
H100_B_M4_ALL = ("h100-2026-12-06b-m4-all.json", "M = 4, every stage")
H100_B_M8_ALL = ("h100-2026-12-06b-m8-all.json", "M = 8, every stage")
H100_GOV_MEAN = ("h100-2026-12-06b-gov-mean-s13.json", "governor on the mean alone")
H100_GOV_EVIDENCE = ("h100-2026-12-06b-gov-evidence-s13.json", "governor on 95% evidence")
#: Then, on a fresh machine (source digest 4e19f35b, which adds ``--governed-guard``), stage 3
#: at M = 8 with the options above: governed blocks guarded by the solo step's p95 x 1.1 + 0.5
#: ms (the default) against its p95 alone, two invocations of one call.
H100_GUARD_DEFAULT = ("h100-2026-12-06b-guard-default-s3.json", "guard p95 × 1.1 + 0.5 ms")
H100_GUARD_P95 = ("h100-2026-12-06b-guard-p95-s3.json", "guard p95")
#: The day's runs at M = 4 and 8, for their bubbles per slot against the guard.
H100_SLOTS = (
    (H100_B_M4_ALL[0], "M = 4, every stage (later)"),
    (H100_M8_ALL[0], "M = 8, every stage, 4 slices (morning)"),
    H100_M8_FINE,
    (H100_B_M8_ALL[0], "M = 8, every stage (later)"),
    H100_GUARD_DEFAULT,
    H100_GUARD_P95,
)
H100_12_06B = (H100_B_M4_ALL, H100_B_M8_ALL, H100_GOV_MEAN, H100_GOV_EVIDENCE,
               H100_GUARD_DEFAULT, H100_GUARD_P95)  # fmt: skip
#: The afternoon's H100 calls of 2026-12-06 (source digest a06fcfbe, commit 385eb62, whose
#: idle split parts the tail at the predicted end; the results name the checkout's commit before
#: it, "+changes"): stages 1 and 3 with the options of ``H100_B_M4_ALL``, per M three
#: invocations of one call: as before, then finer steps (ResNet-18 in 8 graphed slices, VGG-19
#: in 16), then governed blocks guarded by the solo step's p95 alone (``--governed-guard
#: 1.0,0``); the last two replay the first's calibration (``--peer-costs``).
H100_C_M4_OFF = ("h100-2026-12-06c-m4-off-s13.json", "M = 4, as before")
H100_C_M4_FINE = ("h100-2026-12-06c-m4-fine-s13.json", "M = 4, finer steps")
H100_C_M4_GUARD = ("h100-2026-12-06c-m4-guard-s13.json", "M = 4, guard p95")
H100_C_M8_OFF = ("h100-2026-12-06c-m8-off-s13.json", "M = 8, as before")
H100_C_M8_FINE = ("h100-2026-12-06c-m8-fine-s13.json", "M = 8, finer steps")
H100_C_M8_GUARD = ("h100-2026-12-06c-m8-guard-s13.json", "M = 8, guard p95")
#: Then, on a second H100 (the same tree), its peers replaying the calibration of
#: ``H100_C_M8_OFF``: stages 0 and 2 at M = 8 with those options, then stage 1 with both levers
#: at once (ResNet-18 in 8 slices, guard p95 alone); another machine than the arms it would
#: be compared with, so it is shown and not judged.
H100_C_M8_S02 = ("h100-2026-12-06c-m8-off-s02.json", "M = 8, stages 0, 2 (second machine)")
H100_C_M8_BOTH = ("h100-2026-12-06c-m8-fineguard-s1.json",
                  "M = 8, finer steps and guard p95 (second machine)")  # fmt: skip
H100_12_06C = (H100_C_M4_OFF, H100_C_M4_FINE, H100_C_M4_GUARD, H100_C_M8_OFF, H100_C_M8_FINE,
               H100_C_M8_GUARD, H100_C_M8_S02, H100_C_M8_BOTH)  # fmt: skip
#: The evening's H100 call of 2026-12-06 (source digest a17bb115, commit 4510141; the results
#: name an older checkout commit, "+changes"): stages 0 and 2 at M = 8 with the options of
#: ``H100_C_M8_OFF``, the peers replaying ``H100_C_M8_S02``'s calibration; the rank predicting
#: with the minimum of five, then with the feedback predictor (its image segment skipped by the
#: time budget).
H100_D_MIN = ("h100-2026-12-06d-m8-min-s02.json", "M = 8, minimum of five")
H100_D_FEEDBACK = ("h100-2026-12-06d-m8-feedback-s02.json", "M = 8, feedback predictor")
#: A second call on another H100 (source digest 0db55778, commit a44e044), the same stages,
#: options and replayed peers, the rank on the minimum of five: the host going on past a
#: bubble's predicted end on its slot's survivors (``--outlived survivors``), then stopping.
H100_D_SURVIVORS = ("h100-2026-12-06d-m8-survivors-s02.json", "M = 8, past the end: survivors")
H100_D_STOP = ("h100-2026-12-06d-m8-stop-s02.json", "M = 8, past the end: stop")
H100_12_06D = (H100_D_MIN, H100_D_FEEDBACK, H100_D_SURVIVORS, H100_D_STOP)
#: The night's two H100 calls of 2026-12-06 (one machine, source digest 16da3c39, commit
#: c060353; the results name an older checkout commit, "+changes"): stages 1 and 3 with the
#: options of ``H100_C_M8_OFF``, the peers replaying the afternoon's stages-1-and-3
#: calibration of the same M; the image task beside each stage's task with gating
#: "leftovers" (``--leftovers image``), then each stage's task alone. M = 8 first, then M = 4.
H100_E_M8_ON = ("h100-2026-12-06e-m8-leftovers-s13.json", "M = 8, image on the leftovers")
H100_E_M8_OFF = ("h100-2026-12-06e-m8-alone-s13.json", "M = 8, alone")
H100_E_M4_ON = ("h100-2026-12-06e-m4-leftovers-s13.json", "M = 4, image on the leftovers")
H100_E_M4_OFF = ("h100-2026-12-06e-m4-alone-s13.json", "M = 4, alone")
H100_12_06E = (H100_E_M8_ON, H100_E_M8_OFF, H100_E_M4_ON, H100_E_M4_OFF)
# 2026-12-06, late night: the image task's bands channel by channel (first call), then all
# channels at once (second call, and stage 3 again in a third on the same machine)
H100_F_ON = (
    "h100-2026-12-06f-m8-leftovers-s1.json",
    "image on the leftovers, bands channel by channel",
)
H100_F_OFF = ("h100-2026-12-06f-m8-alone-s1.json", "alone (first call)")
H100_G_ON = ("h100-2026-12-06g-m8-leftovers-s13.json", "image on the leftovers")
H100_G_OFF = ("h100-2026-12-06g-m8-alone-s13.json", "alone")
H100_G3_ON = ("h100-2026-12-06g-m8-leftovers-s3b.json", "image on the leftovers, again")
H100_G3_OFF = ("h100-2026-12-06g-m8-alone-s3b.json", "alone, again")
H100_12_06G = (H100_F_ON, H100_F_OFF, H100_G_ON, H100_G_OFF, H100_G3_ON, H100_G3_OFF)
IMAGE_BANDS = "image-bands-h100-2026-12-06.json"
# 2026-12-07: the image task on the leftovers under both past-the-end rules (one call, stages
# 1 and 3), then stage 3 once more with the state taken into pinned memory (a second call)
H100_H_SURVIVORS = ("h100-2026-12-07-m8-survivors-s13.json", "image on the leftovers, survivors")
H100_H_STOP = ("h100-2026-12-07-m8-stop-s13.json", "image on the leftovers, stop")
H100_H_PINNED = ("h100-2026-12-07-m8-pinned-s3.json", "stop, the state taken into pinned memory")
H100_12_07 = (H100_H_SURVIVORS, H100_H_STOP, H100_H_PINNED)
STATE_COPY = "state-copy-h100-2026-12-07.json"
# 2026-12-07, later: every stage at M = 8, then at M = 4, the image task on the leftovers (one
# machine, back to back), each with its bubble ledger
H100_I_M8 = ("h100-2026-12-07b-m8-all.json", "M = 8, every stage, image on the leftovers")
H100_I_M4 = ("h100-2026-12-07b-m4-all.json", "M = 4, every stage, image on the leftovers")
H100_12_07B = (H100_I_M8, H100_I_M4)
H100_12_07B_LEDGERS = (
    (H100_I_M8, "h100-2026-12-07b-ledger-m8-all.json"),
    (H100_I_M4, "h100-2026-12-07b-ledger-m4-all.json"),
)
#: the same bubbles replayed with one thing changed at a time (``harvest_ceiling.py``)
H100_12_07B_CEILINGS = (
    (H100_I_M8, "h100-2026-12-07b-ceiling-m8-all.json"),
    (H100_I_M4, "h100-2026-12-07b-ceiling-m4-all.json"),
)
#: the state's blocks pinned from a thread ahead of the first take (``bench_state_copy.py
#: --pin-ahead``), beside Python alone in the first call, beside a kernel and its wait later
STATE_COPY_AHEAD = ("state-copy-ahead-h100-2026-12-07.json",
                    "state-copy-ahead-cuda-h100-2026-12-07.json")  # fmt: skip


def _files_of(
    arms: Sequence[tuple[str, str]], names: Sequence[str], prefix: str
) -> tuple[tuple[tuple[str, str], str], ...]:
    """Each arm beside its file ``<prefix>-<name>.json`` (its bubble ledger, its replay)."""
    return tuple((arm, f"{prefix}-{n}.json") for arm, n in zip(arms, names, strict=True))


# 2026-12-07, last: the zero-bubble schedule on every stage with and without the image task
# on the leftovers (two calls back to back on one machine), then PageRank's step groups of 2 ms
# against 1 ms at M = 8 (one call, the peers replaying the every-stage M = 8 call's costs)
H100_J_ZB_ON = ("h100-2026-12-07c-zb-leftovers-all.json", "zero-bubble, image on the leftovers")
H100_J_ZB_OFF = ("h100-2026-12-07c-zb-alone-all.json", "zero-bubble, alone")
H100_J_G2 = ("h100-2026-12-07c-m8-group2-s0.json", "M = 8, step groups of 2 ms")
H100_J_G1 = ("h100-2026-12-07c-m8-group1-s0.json", "M = 8, step groups of 1 ms")
H100_12_07C = (H100_J_ZB_ON, H100_J_ZB_OFF, H100_J_G2, H100_J_G1)
H100_12_07C_NAMES = ("zb-leftovers-all", "zb-alone-all", "m8-group2-s0", "m8-group1-s0")
H100_12_07C_LEDGERS = _files_of(H100_12_07C, H100_12_07C_NAMES, "h100-2026-12-07c-ledger")
H100_12_07C_CEILINGS = _files_of(H100_12_07C, H100_12_07C_NAMES, "h100-2026-12-07c-ceiling")
#: 2026-12-07, late morning: each pair of calls ran one tree, the second arm with a step guard
#: scaled by the task's own recent steps in bubbles against its profile (``--guard
#: bubbles``, backed out after: the profile took in the first step, and the guards of PageRank
#: and the image task collapsed), both replaying one calibration of the peers
H100_K_ZB_PROFILE = ("h100-2026-12-07d-zb-guard-profile.json", "zero-bubble, guard by the budget")
H100_K_ZB_STEPS = ("h100-2026-12-07d-zb-guard-bubbles.json", "zero-bubble, guard collapsed")
H100_K_M8_PROFILE = ("h100-2026-12-07d-m8-guard-profile.json", "M = 8, guard by the budget")
H100_K_M8_STEPS = ("h100-2026-12-07d-m8-guard-bubbles.json", "M = 8, guard collapsed")
H100_12_07D = (H100_K_ZB_PROFILE, H100_K_ZB_STEPS, H100_K_M8_PROFILE, H100_K_M8_STEPS)
H100_12_07D_NAMES = ("zb-guard-profile", "zb-guard-bubbles", "m8-guard-profile", "m8-guard-bubbles")
H100_12_07D_LEDGERS = _files_of(H100_12_07D, H100_12_07D_NAMES, "h100-2026-12-07d-ledger")
H100_12_07D_CEILINGS = _files_of(H100_12_07D, H100_12_07D_NAMES, "h100-2026-12-07d-ceiling")
#: 2026-12-07, early afternoon, one machine: the zero-bubble schedule's stage 0 (PageRank, the
#: image task on the leftovers) with a step group guarded as one call (the tree since 6693dda)
#: against as the whole group (38dc600), two pairs, the second in the other order; then M = 8
#: and the zero-bubble schedule on every stage with the first tree; every call under
#: ``run_queue.py``, the peers replaying 12-07b's (M = 8) and 12-07c's (zero-bubble) costs
H100_L_CALL_A = ("h100-2026-12-07e-zb-s0-call-a.json", "stage 0, guard per call (first pair)")
H100_L_GROUP_A = ("h100-2026-12-07e-zb-s0-group-a.json", "stage 0, guard per group (first pair)")
H100_L_GROUP_B = ("h100-2026-12-07e-zb-s0-group-b.json", "stage 0, guard per group (second pair)")
H100_L_CALL_B = ("h100-2026-12-07e-zb-s0-call-b.json", "stage 0, guard per call (second pair)")
H100_L_M8 = ("h100-2026-12-07e-m8-all.json", "M = 8, every stage")
H100_L_ZB = ("h100-2026-12-07e-zb-all.json", "zero-bubble, every stage")
H100_12_07E = (H100_L_CALL_A, H100_L_GROUP_A, H100_L_GROUP_B, H100_L_CALL_B, H100_L_M8, H100_L_ZB)
H100_12_07E_NAMES = ("zb-s0-call-a", "zb-s0-group-a", "zb-s0-group-b", "zb-s0-call-b", "m8-all",
                     "zb-all")  # fmt: skip
H100_12_07E_LEDGERS = _files_of(H100_12_07E, H100_12_07E_NAMES, "h100-2026-12-07e-ledger")
H100_12_07E_FLOATS = _files_of(H100_12_07E, H100_12_07E_NAMES, "h100-2026-12-07e-floats")
H100_12_07E_RUN_QUEUE = _files_of(H100_12_07E, H100_12_07E_NAMES, "run-queue-h100-2026-12-07e")
#: 2026-12-07, late afternoon, one machine: the image task's band step with its columns in blocks
#: and replayed as CUDA graphs (the tree at c7fc80a, ``"cuda_graphs": true``) against tap by tap
#: and eager (3d9d4b5's package), the zero-bubble schedule on every stage, then stage 1 at M = 8
#: (stages 1 and 3 were asked for; stage 3 did not fit the call's time budget), the peers
#: replaying 12-07c's (zero-bubble) and 12-07b's (M = 8) costs
H100_M_ZB_ON = ("h100-2026-12-07f-zb-on.json", "zero-bubble, band step graphed")
H100_M_ZB_OFF = ("h100-2026-12-07f-zb-off.json", "zero-bubble, band step as before")
H100_M_M8_ON = ("h100-2026-12-07f-m8-on-s1.json", "M = 8, stage 1, band step graphed")
H100_M_M8_OFF = ("h100-2026-12-07f-m8-off-s1.json", "M = 8, stage 1, band step as before")
H100_12_07F = (H100_M_ZB_ON, H100_M_ZB_OFF, H100_M_M8_ON, H100_M_M8_OFF)
H100_12_07F_LEDGERS = _files_of(H100_12_07F, ("zb-on", "zb-off", "m8-on-s1", "m8-off-s1"),
                                "h100-2026-12-07f-ledger")  # fmt: skip
#: the band step alone on that machine, four ways (``bench_image_bands.py``)
IMAGE_BANDS_12_07F = "image-bands-h100-2026-12-07f.json"
#: 2026-12-07, evening, one H100 machine: past the predicted end, the leftovers task's alone
#: (``--outlived hand-on``, the tree at f477cde, source digest 8567538c230ebe50) against stop,
#: the same package back to back, the image task's band steps graphed; zero-bubble on every
#: stage, then stage 3 at M = 8; the peers replaying 12-07c's and 12-07b's costs
H100_N_ZB_ON = ("h100-2026-12-07g-zb-hand-on.json", "zero-bubble, past the end: hand-on")
H100_N_ZB_OFF = ("h100-2026-12-07g-zb-stop.json", "zero-bubble, past the end: stop")
H100_N_M8_ON = ("h100-2026-12-07g-m8-hand-on-s3.json", "M = 8, stage 3, past the end: hand-on")
H100_N_M8_OFF = ("h100-2026-12-07g-m8-stop-s3.json", "M = 8, stage 3, past the end: stop")
H100_12_07G = (H100_N_ZB_ON, H100_N_ZB_OFF, H100_N_M8_ON, H100_N_M8_OFF)
H100_12_07G_NAMES = ("zb-hand-on", "zb-stop", "m8-hand-on-s3", "m8-stop-s3")
H100_12_07G_LEDGERS = _files_of(H100_12_07G, H100_12_07G_NAMES, "h100-2026-12-07g-ledger")
H100_12_07G_ACTIONS = _files_of(H100_12_07G, H100_12_07G_NAMES, "h100-2026-12-07g-actions")
#: runs of announced bubbles with room that no task took, in every committed H100 ledger
#: (``host_stalls.py``; arithmetic over the ledgers)
HOST_STALLS = "host-stalls-h100-2026-12-07.json"
#: 2026-12-08, one H100 machine (the tree at 882a8f0, source digest
#: 6ecdb42c38208429): every stage at M = 8, "stop", the image task's band step graphed on the
#: leftovers, each segment's tasks checkpointed once before its blocks, the peers replaying
#: 12-07b's costs; its bubble ledger, action times and stalls; then the state copy's "in flight"
H100_O_M8 = (
    "h100-2026-12-08-m8-stop-all.json",
    "M = 8, every stage, checkpointed before the blocks",
)
H100_12_08 = (H100_O_M8,)
H100_12_08_LEDGERS = ((H100_O_M8, "h100-2026-12-08-ledger-m8-stop-all.json"),)
#: its bubbles replayed through the host's step rule, one thing changed at a time
H100_12_08_CEILINGS = ((H100_O_M8, "h100-2026-12-08-ceiling-m8-stop-all.json"),)
#: the every-stage M = 8 calls before it (other machines, other trees): history, not an A/B
H100_M8_EVERY_STAGE = (H100_I_M8, H100_L_M8, H100_O_M8)
HOST_STALLS_12_08 = "host-stalls-h100-2026-12-08.json"
STATE_COPY_INFLIGHT = "state-copy-inflight-h100-2026-12-08.json"
#: the host's path alone on that machine, before, between and after its calls, in call order
HOST_PATH_H100_12_07E = tuple(
    (f"host-path-h100-2026-12-07e-{k}.json", label)
    for k, label in (("a", "before the first pair"), ("b", "after M = 8, every stage"),
                     ("c", "before the second pair"), ("d", "after zero-bubble, every stage"))
)  # fmt: skip
#: the host's path on the 2-core CPU box, hot and after an idle spell (``bench_host_path.py
#: --idle-ms --spin-ms``, [Note: a cold path]); the four settings alternating, three rounds
HOST_PATH_COLD_CPU = tuple(
    (f"host-path-cold-cpu-2026-12-07-idle{idle}-spin{spin}-{n}.json", label)
    for n in (1, 2, 3)
    for idle, spin, label in ((0, 0, "back to back"), (8, 2, "8 ms asleep, 2 ms spinning"),
                              (28, 2, "28 ms asleep, 2 ms spinning"),
                              (28, 0, "28 ms asleep, no spin"))
)  # fmt: skip
#: PageRank's stages replayed on the guard of one 0.16 ms call (0.16 x 1.1 + 0.5 ms): the
#: replay on its blocks' guard, the replay on that one, and the call they replay
H100_CALL_GUARD = tuple(
    (f"{day}-ceiling-{n}.json", f"{day}-ceiling-{n}-call-guard.json", label)
    for day, n, label in (
        ("h100-2026-12-07c", "zb-leftovers-all", "zero-bubble, every stage (12-07c)"),
        ("h100-2026-12-07d", "zb-guard-profile", "zero-bubble, every stage (12-07d)"),
        ("h100-2026-12-07b", "m8-all", "M = 8, every stage (12-07b)"),
        ("h100-2026-12-07d", "m8-guard-profile", "M = 8, every stage (12-07d)"),
        ("h100-2026-12-07c", "m8-group1-s0", "M = 8, stage 0, step groups of 1 ms (12-07c)"),
    )
)
#: a task's first steps in a fresh process on the H100 (``first_steps.py``)
FIRST_STEPS_H100 = "first-steps-h100-2026-12-07.json"
#: the task host's own paths (bench_host_path.py) on the H100 machine's host CPU, that evening
HOST_PATH_H100_HOST = (("host-path-h100-host-2026-12-07.json", "the H100 machine (c5417ea)"),)
#: Lever 6 on the H200: each of the mix's four tasks on each of the four stages (M = 4,
#: time-sliced, governed, the options of ``H100_SPIN``), one run over two calls (``--resume``);
#: every placement's harvest is read off its cells (``bench.placement``).
H200_PLACEMENT = "h200-2026-12-06-placement.json"
#: The modes a lever's A/B compares when both arms ran the product's two.
_AB_MODES = ("managed", "governed")
#: One step's time, eager vs graphed (benchmarks/bench_graphed_steps.py).
GRAPHED_STEPS = "graphed-steps-h200-2026-12-04.json"
CPU_OLD = "cpu-2026-12-02.json"
CPU_DRY_RUN = "cpu-2026-12-04-dry-run.json"
#: The first result with pause latency: the same CPU profile, managed and governed only.
CPU_PAUSE = "cpu-2026-12-04-pause.json"

#: FreeRide's published per-task results (paper notes §14; corrected = published - overhead).
FREERIDE_TASKS: tuple[tuple[str, str, float, float | None, float], ...] = (
    # (our task, label, overhead, saving published, saving corrected)
    ("resnet18", "ResNet-18", 0.0003, 0.0807, 0.0804),
    ("resnet50", "ResNet-50", 0.0136, 0.0592, 0.0456),
    ("vgg19", "VGG-19", 0.0210, 0.0534, 0.0324),
    ("sgd_mf", "SGD", 0.0116, 0.1987, 0.1871),
    ("pagerank", "PageRank", 0.0005, 0.0306, 0.0301),
    ("image", "image", 0.0074, 0.0485, 0.0411),
    ("mix", "mix", 0.0157, None, 0.0615),
)
_MARK = re.compile(r"<!-- table:(?P<name>[a-z0-9-]+) -->\n(?P<body>.*?)<!-- /table:(?P=name) -->",
                   re.S)  # fmt: skip
_MODES = ("managed", "governed", "naive")


# -- results ----------------------------------------------------------------------------------


@cache
def raw(name: str) -> dict[str, Any]:
    """A committed result as it was written."""
    data: dict[str, Any] = json.loads((RESULTS / name).read_text())
    return data


def _recomputed(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a result, its blocks and segments perhaps changed) with its tables computed
    by today's arithmetic."""
    fill_tables(data, stages=int(data["config"]["stages"]))
    return data


@cache
def result(name: str) -> dict[str, Any]:
    """A committed result with its tables computed by today's arithmetic."""
    return _recomputed(copy.deepcopy(raw(name)))


@cache
def merged(names: tuple[str, ...]) -> dict[str, Any]:
    """Results of one run measured over several calls (each a subset of the real stages),
    as one result: their blocks and segments together, tables by today's arithmetic."""
    data = copy.deepcopy(raw(names[0]))
    for name in names[1:]:
        more = raw(name)
        data["blocks"] = [*data["blocks"], *more["blocks"]]
        data["runs"] = [*data["runs"], *copy.deepcopy(more["runs"])]
    return _recomputed(data)


@cache
def on_stages(name: str, stages: tuple[int, ...]) -> dict[str, Any]:
    """A result read on some of its real stages only (its blocks and segments there), tables
    by today's arithmetic: a run over every stage beside one over fewer, like with like."""
    data = copy.deepcopy(raw(name))
    data["blocks"] = [b for b in data["blocks"] if int(b["stage"]) in stages]
    for run in data["runs"]:
        run["segments"] = [s for s in run.get("segments", []) if int(s["stage"]) in stages]
    return _recomputed(data)


def bench_results() -> list[str]:
    """Names of the committed ``freeride-lab bench`` results."""
    names = []
    for path in sorted(RESULTS.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("benchmark") == "bench":
            names.append(path.name)
    return names


def mix_rows(data: Mapping[str, Any], label: str = "") -> list[tuple[str, dict[str, Any]]]:
    """(``label``, pipeline row) for each of a result's pipeline rows of the mix."""
    return [(label, r) for r in data["pipeline"] if r["case"] == "mix"]


def h200_rows() -> list[tuple[str, dict[str, Any]]]:
    """(file, pipeline row) of the mix for each H200 run BENCHMARKS.md reports, in order."""
    return [row for name in (H200_M4, H200_M8) for row in mix_rows(result(name), name)]


def _iv(row: Mapping[str, Any], name: str, digits: int = 2, *, signed: bool = False) -> str:
    return fmt_interval(
        row[f"{name}_frac"], row[f"{name}_lo_frac"], row[f"{name}_hi_frac"], digits,
        signed=signed,
    )  # fmt: skip


def _ms(row: Mapping[str, Any], name: str) -> str:
    return fmt_interval(row[f"{name}_ms"], row[f"{name}_lo_ms"], row[f"{name}_hi_ms"], 2, pct=False)


def _first_of_run(rows: list[list[str]]) -> list[list[str]]:
    """Leave the run column empty after the first row of each run."""
    last = None
    for r in rows:
        if r[0] == last:
            r[0] = ""
        else:
            last = r[0]
    return rows


# -- BENCHMARKS.md tables ---------------------------------------------------------------------


def h200_overhead(pipeline_rows: list[tuple[str, dict[str, Any]]] | None = None) -> list[str]:
    rows = [
        [run_label(r["run"]), r["mode"], str(r["blocks_min"]),
         _iv(r, "overhead_all_stages_estimate", signed=True),
         _iv(r, "overhead_one_stage_mean", signed=True),
         f"{_iv(r, 'overhead_one_stage_worst', signed=True)} ({r['worst_task']})"]
        for _, r in (h200_rows() if pipeline_rows is None else pipeline_rows)
    ]  # fmt: skip
    return md_table(
        ["run", "mode", "blocks per mode", "**all stages at once (estimate)**",
         "one stage at a time: mean", "one stage at a time: worst"],
        _first_of_run(rows),
    )  # fmt: skip


def h200_harvest(pipeline_rows: list[tuple[str, dict[str, Any]]] | None = None) -> list[str]:
    rows = [
        [run_label(r["run"]), r["mode"], _iv(r, "harvest", 1),
         f"{_iv(r, 'harvest_of_theory_limit', 0)} of {fmt_pct(r['bubble_limit_frac'], 1)}",
         f"{_iv(r, 'harvest_of_measured_idle', 0)} of {fmt_pct(r['idle_frac'], 1)}",
         f"{_iv(r, 'saving_published', 1)} / {_iv(r, 'saving_corrected', 1)}",
         f"{_ms(r, 'latency_p50')} / {_ms(r, 'latency_p99')}"]
        for _, r in (h200_rows() if pipeline_rows is None else pipeline_rows)
    ]  # fmt: skip
    return md_table(
        ["run", "mode", "harvest", "of the theory limit", "of the measured idle time",
         "saving published / corrected", "edge → step p50 / p99 ms"],
        _first_of_run(rows),
    )  # fmt: skip


def h200_old_vs_new() -> list[str]:
    rows = []
    for name, new in h200_rows():
        old = next(
            r
            for r in raw(name)["pipeline"]
            if (r["run"], r["case"], r["mode"]) == (new["run"], new["case"], new["mode"])
        )
        rows.append(
            [
                run_label(new["run"]),
                new["mode"],
                f"{fmt_pct(old['overhead_mean_frac'], signed=True)} → "
                f"{fmt_pct(new['overhead_one_stage_mean_frac'], signed=True)}",
                f"{fmt_pct(old['overhead_sum_frac'], signed=True)} → "
                f"{fmt_pct(new['overhead_all_stages_estimate_frac'], signed=True)}",
                f"{fmt_pct(old['harvest_frac'], 1)} → {fmt_pct(new['harvest_frac'], 1)}",
                f"{fmt_pct(old['harvest_of_limit_frac'], 0)} → "
                f"{fmt_pct(new['harvest_of_theory_limit_frac'], 0)}",
                f"{fmt_pct(old['saving_corrected_frac'], 1)} → "
                f"{fmt_pct(new['saving_corrected_frac'], 1)}",
            ]
        )
    return [
        *md_table(
            ["run", "mode", "one stage: mean", "all stages (sum)", "harvest",
             "of theory limit", "saving corrected"],
            _first_of_run(rows),
        ),
        "",
        *textwrap.wrap(
            "Old → new, same blocks. Overheads moved because the estimate is now the mean of "
            "the per-block paired differences (the quantity the interval is about) instead of "
            "their median; harvest moved because each run's side work is now valued at that "
            f"run's own solo speed instead of the median over all runs of the file ({_spread()}).",
            100,
        ),
    ]  # fmt: skip


def _spread() -> str:
    """The task whose solo speed differed most between the runs of the M = 4 file, in words."""
    speeds: dict[str, dict[str, float]] = {}
    unit = {}
    for d in result(H200_M4)["dedicated"]:
        speeds.setdefault(d["task"], {})[d["run"]] = d["dedicated_per_s"]
        unit[d["task"]] = d["unit"]
    task, runs = max(speeds.items(), key=lambda kv: max(kv[1].values()) / min(kv[1].values()))
    parts = [f"{fmt_rate(v)} {unit[task]}/s in run {r}" for r, v in runs.items()]
    return f"{task}'s solo speed was " + " and ".join(parts)


def h200_goals(results: list[dict[str, Any]] | None = None) -> list[str]:
    rows = []
    for data in results if results is not None else [result(n) for n in (H200_M4, H200_M8)]:
        for c in data["goal_checks"]:
            if c["case"] != "mix":
                continue
            sign = "≤" if c["kind"] == "max" else "≥"
            figure = goal_figure(c)
            met = "**yes**" if c["met"] else ("no" if not c["note"] else f"no ({c['note']})")
            rows.append(
                [run_label(c["run"]), c["mode"], f"{c['goal']} {sign} {fmt_pct(c['threshold'], 1)}",
                 figure, met]
            )  # fmt: skip
    return md_table(["run", "mode", "goal", "figure [95% interval]", "met"], _first_of_run(rows))


def h200_per_stage() -> list[str]:
    rows = []
    for r in result(H200_M4)["summary"]:
        if r["run"] != "m4-timeslice" or r["case"] != "mix" or r["mode"] == "vanilla":
            continue
        rows.append(
            [f"{r['stage']} · {r['task']}", r["mode"], _iv(r, "overhead", signed=True),
             f"{fmt_pct(r['overhead_median_frac'], 2, signed=True)} "
             f"({fmt_pct(r['overhead_min_frac'])}..{fmt_pct(r['overhead_max_frac'])})",
             f"{fmt_rate(r['throughput_per_s'])} {r['unit']}/s",
             fmt_pct(r["bubble_used_frac"], 0), _iv(r, "harvest", 1),
             f"{_iv(r, 'harvest_of_measured_idle', 0)} of {fmt_pct(r['vanilla_idle_frac'], 0)}",
             f"{r['overruns']} of {r['side_steps']}"]
        )  # fmt: skip
    return md_table(
        ["stage · task", "mode", "overhead (mean) [95%]", "median (min..max)",
         "side-task throughput", "bubble time used", "harvest [95%]", "of measured idle",
         "overruns in blocks"],
        _first_of_run(rows),
    )  # fmt: skip


def h200_dedicated() -> list[str]:
    rows = []
    for name in (H200_M4, H200_M8):
        for d in result(name)["dedicated"]:
            unit = f" {d['unit']}/s"
            rows.append(
                [run_label(d["run"]), f"{d['stage']} · {d['task']}",
                 f"{fmt_rate(d['before_per_s'])}{unit} in {fmt_num(d['solo_before_s'], '.2f')} s",
                 f"{fmt_rate(d['after_per_s'])}{unit}" if d["after_measured"] else NOT_MEASURED,
                 fmt_pct(d["spread_frac"], 1) if d["after_measured"] else NOT_MEASURED,
                 f"{d['task_overruns_total']} of {d['task_steps_total']}"
                 if d["task_steps_total"] is not None else NOT_MEASURED]
            )  # fmt: skip
    return md_table(
        ["run", "stage · task", "solo phase before the blocks", "after the blocks", "spread",
         "task's steps in the run: overran"],
        _first_of_run(rows),
    )  # fmt: skip


def h200_instrumentation() -> list[str]:
    rows = []
    for name in (H200_M4, H200_M8):
        for run, head in result(name)["headline"].items():
            figure = head.get("instrumentation_overhead_frac")
            if figure:
                iv = fmt_interval(figure["value"], figure["lo"], figure["hi"], 2, signed=True)
                rows.append([run_label(run), iv])
    return md_table(["run", "instrumentation: timed vs plain stage [95%]"], rows)


def freeride_comparison() -> list[str]:
    """FreeRide's per-task numbers beside ours (managed, the stage the mix puts the task on)."""
    summary = result(H200_M4)["summary"]
    pipeline = {(r["run"], r["mode"]): r for r in result(H200_M4)["pipeline"] if r["case"] == "mix"}

    def stage_row(run: str, task: str) -> dict[str, Any] | None:
        return next(
            (r for r in summary if (r["run"], r["case"], r["task"], r["mode"])
             == (run, "mix", task, "managed")),
            None,
        )  # fmt: skip

    rows = []
    for task, label, over, published, corrected in FREERIDE_TASKS:
        saving = (
            f"{fmt_pct(published)} / {fmt_pct(corrected)}"
            if published
            else (f"- / {fmt_pct(corrected)}")
        )
        if task == "mix":
            ts, mps = pipeline.get(("m4-timeslice", "managed")), pipeline.get(("m4-mps", "managed"))
            ours = " / ".join(
                _iv(p, "overhead_all_stages_estimate", signed=True) if p else "-" for p in (ts, mps)
            )
            harvest = (
                f"{_iv(ts, 'harvest', 1)} ({fmt_pct(ts['harvest_of_theory_limit_frac'], 0)} of "
                "the theory limit)"
                if ts else "-"
            )  # fmt: skip
            rows.append([label, f"{fmt_pct(over)} (all stages)", saving,
                         f"{ours} (all stages, estimate)", harvest])  # fmt: skip
            continue
        ts, mps = stage_row("m4-timeslice", task), stage_row("m4-mps", task)
        if ts is None:
            rows.append([label, fmt_pct(over), saving, "not run on the GPU", "-"])
            continue
        ours = " / ".join(_iv(r, "overhead", signed=True) if r else "-" for r in (ts, mps))
        rows.append([label, fmt_pct(over), saving, f"{ours} (stage {ts['stage']} only)",
                     _iv(ts, "harvest", 1)])  # fmt: skip
    return md_table(
        ["task", "FreeRide overhead (its stages at once)", "saving published / corrected",
         "ours: overhead time-sliced / MPS [95%]", "ours: harvest (time-sliced)"],
        rows,
    )  # fmt: skip


def _cpu_pipeline(name: str) -> list[str]:
    data = result(name)
    rows = [
        [r["mode"], str(r["stages_covered"]), str(r["blocks_min"]),
         _iv(r, "overhead_all_stages_estimate", 1, signed=True),
         _iv(r, "overhead_one_stage_mean", 1, signed=True),
         f"{_iv(r, 'overhead_one_stage_worst', 1, signed=True)} ({r['worst_task']})",
         f"{_iv(r, 'harvest', 1)}",
         f"{fmt_pct(r['harvest_of_theory_limit_frac'], 0)} / "
         f"{fmt_pct(r['harvest_of_measured_idle_frac'], 0)}",
         f"{fmt_pct(r['saving_published_frac'], 1)} / {fmt_pct(r['saving_corrected_frac'], 1)}",
         f"{fmt_num(r['latency_p50_ms'], '.2f')} / {fmt_num(r['latency_p99_ms'], '.2f')}"]
        for r in data["pipeline"]
        if r["case"] == "mix"
    ]  # fmt: skip
    return md_table(
        ["mode (CPU)", "stages", "blocks per mode", "all stages at once (estimate)",
         "one stage: mean", "one stage: worst", "harvest", "of theory limit / measured idle",
         "saving published / corrected", "latency p50 / p99 ms"],
        rows,
    )  # fmt: skip


def cpu_2026_12_02() -> list[str]:
    return _cpu_pipeline(CPU_OLD)


def cpu_dry_run() -> list[str]:
    data = result(CPU_DRY_RUN)
    lines = _cpu_pipeline(CPU_DRY_RUN)
    rows = [
        [f"{d['stage']} · {d['task']}",
         f"{fmt_rate(d['before_per_s'])} in {fmt_num(d['solo_before_s'], '.1f')} s "
         f"({d['solo_before_steps']} steps)",
         f"{fmt_rate(d['after_per_s'])} in {fmt_num(d['solo_after_s'], '.1f')} s "
         f"({d['solo_after_steps']} steps)",
         fmt_pct(d["spread_frac"], 1), "**yes**" if d["unstable"] else "no",
         f"{d['task_overruns_total']} of {d['task_steps_total']}"]
        for d in data["dedicated"]
    ]  # fmt: skip
    return [
        *lines,
        "",
        *md_table(
            ["stage · task (CPU)", "solo before the blocks (units/s)", "after the blocks",
             "spread", "flagged (> 10%)", "task's steps in the run: overran"],
            rows,
        ),
    ]  # fmt: skip


def cpu_pause() -> list[str]:
    data = result(CPU_PAUSE)
    header = ["mode (CPU)", "stages", "blocks", "bubbles used with a step started after their end",
              "end → last late step p99 ms [95%]", "edge → step p99 ms [95%]"]  # fmt: skip
    rows = []
    for r in data["pipeline"]:
        mine = [b for b in data["blocks"] if b["mode"] == r["mode"]]
        used = [x for b in mine for x in b["pause_ms"]]
        late = f"{sum(x > 0 for x in used)} of {len(used)}"
        cells = [r["mode"], str(r["stages_covered"]), str(len(mine)), late]
        rows.append([*cells, fmt_ms_interval(r, "pause_p99"), fmt_ms_interval(r, "latency_p99")])
    return md_table(header, rows)


def _idle_split_rows() -> list[tuple[str, dict[str, Any]]]:
    return mix_rows(merged(tuple(name for name, _ in H200_IDLE_SPLIT)))


def _split_rows() -> list[tuple[str, dict[str, Any]]]:
    return mix_rows(merged(H200_SPLIT))


def _per_stage(summary: list[dict[str, Any]], cases: tuple[str, ...]) -> list[str]:
    rows = [
        [str(r["stage"]), r["task"], r["mode"],
         fmt_frac_interval(r, "overhead", 2, signed=True),
         fmt_frac_interval(r, "harvest", 1),
         fmt_pct(r["idle_frac"], 0)]
        for r in summary
        if r["case"] in cases and r["mode"] != "vanilla"
    ]  # fmt: skip
    return md_table(["stage", "task", "mode", "overhead [95%]", "harvest [95%]", "idle"], rows)


def h200_split_per_stage() -> list[str]:
    return _per_stage(merged(H200_SPLIT)["summary"], ("mix",))


def _instrument_rows() -> list[tuple[str, dict[str, Any]]]:
    return mix_rows(result(H200_INSTRUMENT))


def h200_instrument_per_stage() -> list[str]:
    return _per_stage(result(H200_INSTRUMENT)["summary"], ("mix", "instrumentation"))


def h200_instrument_old_vs_new() -> list[str]:
    """The same run (M = 4, time-sliced, the mix, managed) before and after the instrument and
    bubble-table changes, one line per figure with why it moved."""
    old = next(r for _, r in _split_rows() if r["mode"] == "managed")
    new = next(r for _, r in _instrument_rows() if r["mode"] == "managed")
    why = {
        "idle (measured)": "the bubbles now include the idle between steps (window end to the "
        "next step's first action, optimizer excluded), so more of each step counts as idle",
        "harvest of measured idle": "the same harvest over the larger measured idle",
        "overhead, all stages (estimate)": "a different call (new calibration, noise of five "
        "blocks); the harness's real rank no longer runs a second all-reduce per step to agree "
        "on stops",
        "overhead, one stage: mean": "as above",
        "harvest": "within the intervals of both calls",
        "edge → step p50 / p99 ms": "unchanged: the real rank of this harness times on the host, "
        "where the edge path did not change",
    }
    pairs = {
        "idle (measured)": (fmt_pct(old["idle_frac"], 1), fmt_pct(new["idle_frac"], 1)),
        "harvest of measured idle": (
            _iv(old, "harvest_of_measured_idle", 0), _iv(new, "harvest_of_measured_idle", 0)),
        "overhead, all stages (estimate)": (
            _iv(old, "overhead_all_stages_estimate", signed=True),
            _iv(new, "overhead_all_stages_estimate", signed=True)),
        "overhead, one stage: mean": (
            _iv(old, "overhead_one_stage_mean", signed=True),
            _iv(new, "overhead_one_stage_mean", signed=True)),
        "harvest": (_iv(old, "harvest", 1), _iv(new, "harvest", 1)),
        "edge → step p50 / p99 ms": (
            f"{_ms(old, 'latency_p50')} / {_ms(old, 'latency_p99')}",
            f"{_ms(new, 'latency_p50')} / {_ms(new, 'latency_p99')}"),
    }  # fmt: skip
    rows = [[name, a, b, why[name]] for name, (a, b) in pairs.items()]
    return md_table(["figure (managed)", "before (two calls)", "now (one call)", "why"], rows)


def timing_overhead() -> list[str]:
    rows = []
    for name in TIMING_OVERHEAD:
        data = raw(name)
        case = data["cases"][0]
        rc = data["recorder_ns_per_action"]
        if "overhead_frac" in case:  # today's script: paired blocks with intervals
            o, u = case["overhead_frac"], case["overhead_us_per_action"]
            overhead = fmt_interval(o["value"], o["lo"], o["hi"], 2, signed=True)
            per_action = fmt_interval(u["value"], u["lo"], u["hi"], 0, pct=False)
            code = "today (plain: no recorder)"
        else:  # the script before: medians of steps, no interval
            overhead = fmt_pct(case["overhead_ratio"] - 1, 2, signed=True) + " (median)"
            per_action = f"{case['overhead_us_per_action']:.0f} (median)"
            code = "before (plain: recorder with two syncs per step)"
        rows.append(
            [name.removeprefix("timing-overhead-h200-2026-12-04-").removesuffix(".json"), code,
             f"{case['median_step_ms']['timed']:.1f} / {case['median_step_ms']['plain']:.1f}",
             overhead, per_action,
             f"{rc['no_edges']['median'] / 1e3:.1f} / "
             f"{rc['edges_and_predictor']['median'] / 1e3:.1f}"]
        )  # fmt: skip
    return md_table(
        ["call", "instrument", "step ms timed / plain (median)", "overhead [95%]",
         "µs per action [95%]", "recorder start+stop µs (no edges / edges)"],
        rows,
    )  # fmt: skip


def timing_overhead_quiet() -> list[str]:
    rows = []
    for name in (*TIMING_OVERHEAD_C, TIMING_OVERHEAD_D):
        data = raw(name)
        case, rc = data["cases"][0], data["recorder_ns_per_action"]
        cfg = case["config"]
        options = cfg.get("runtime") or cfg.get("extra") or {}  # run.json before/after options
        announce = options.get("announce_min_ms", 1.0)
        rows.append(
            [f"d_model {cfg['d_model']}, seq {cfg['seq_len']}",
             ("every gap" if announce == 0 else f"≥ {announce:g} ms predicted")
             + (" (later call, events recycled)" if name == TIMING_OVERHEAD_D else ""),
             *_timing_cells(case, rc)]
        )  # fmt: skip
    return md_table(
        ["model (one stage, 8 micro-batches)", "bubbles announced", *_TIMING_HEADER], rows
    )


_TIMING_HEADER = ("step ms timed / plain", "overhead [95%]", "µs per action [95%]",
                  "block pairs", "recorder µs: no edges / edges / quiet")  # fmt: skip


def _timing_cells(case: dict[str, Any], recorder: dict[str, Any]) -> list[str]:
    """A paired-block timing case's cells under ``_TIMING_HEADER``."""
    o, u = case["overhead_frac"], case["overhead_us_per_action"]
    return [
        f"{case['median_step_ms']['timed']:.1f} / {case['median_step_ms']['plain']:.1f}",
        fmt_interval(o["value"], o["lo"], o["hi"], 2, signed=True),
        fmt_interval(u["value"], u["lo"], u["hi"], 1, pct=False),
        str(case["block_pairs"]),
        " / ".join(
            f"{recorder[k]['median'] / 1e3:.1f}"
            for k in ("no_edges", "edges_and_predictor", "edges_quiet_slots")
        ),
    ]


def timing_overhead_cpu() -> list[str]:
    rows = []
    for name in TIMING_OVERHEAD_CPU:
        data = raw(name)
        for case in data["cases"]:
            cells = _timing_cells(case, data["recorder_ns_per_action"])
            rows.append([name.removesuffix(".json"), case["case"], *cells])
    return md_table(["result (CPU)", "case", *_TIMING_HEADER], rows)


def fidelity_cpu() -> list[str]:
    rows = []
    for r in raw(FIDELITY_CPU)["results"]:
        ranks = r["per_rank"]
        per_action = [x["overhead_ms_per_action"] for x in ranks]
        rows.append(
            [f"{r['schedule']} {r['stages']}-{r['microbatches']}-{r['chunks']}",
             f"{r['action_ms']:g}", fmt_pct(r["theory_frac"], 1),
             " / ".join(fmt_pct(x["measured_frac"], 1) for x in ranks),
             f"{max(x['points_above_theory'] for x in ranks):+.1f}",
             " / ".join(f"{x['schedule_ms_per_step']:.0f}" for x in ranks),
             " / ".join(f"{x['peer_ms_per_step'] + x['host_ms_per_step']:.0f}" for x in ranks),
             f"{min(per_action):.2f} to {max(per_action):.2f}"]
        )  # fmt: skip
    return md_table(
        ["schedule S-M-V (CPU)", "action ms", "theory", "measured idle per rank",
         "worst rank: points above theory", "schedule idle ms/step per rank",
         "peer + host ms/step per rank", "peer + host ms per action"],
        rows,
    )  # fmt: skip


def _record_interval(
    x: Mapping[str, float],
    digits: int,
    *,
    pct: bool = False,
    signed: bool = False,
    scale: float = 1.0,
) -> str:
    """A benchmark's ``{"value", "lo", "hi"}`` figure with its interval, times ``scale``."""
    return fmt_interval(x["value"] * scale, x["lo"] * scale, x["hi"] * scale, digits, pct=pct,
                        signed=signed)  # fmt: skip


def _predictor_rows(label: str, replayed: Mapping[str, Any], ref: str) -> list[list[str]]:
    """One row per predictor of a ``bench_predictor`` replay: its figures and, but for the
    reference, their paired differences from it."""

    def iv(e: Mapping[str, Any], name: str, *, signed: bool = False) -> str:
        return _record_interval(e[name], 1, pct=True, signed=signed)

    rows = []
    for name, e in replayed["predictors"].items():
        vs = [iv(e, f"{f}_vs_{ref}", signed=True) if name != ref else "—"
              for f in ("planned_frac", "over_frac", "miss_frac")]  # fmt: skip
        rows.append([label, f"{replayed['steps_measured']} / {replayed['blocks']}", name,
                     f"{e['bubbles']:,}", iv(e, "planned_frac"), iv(e, "over_frac"),
                     iv(e, "miss_frac"), *vs])  # fmt: skip
    return rows


def _predictor_header(first: str, ref: str) -> list[str]:
    versus = [f"{figure} vs {ref} (pts)" for figure in ("planned", "over", "missed")]
    return [first, "steps / blocks", "predictor", "bubbles", "planned", "over", "missed", *versus]


def predictor_cpu() -> list[str]:
    data = raw(PREDICTOR_CPU)
    ref = data["reference"]
    rows = [row for run in data["runs"] for row in _predictor_rows(run["run"], run, ref)]
    return md_table(_predictor_header("run (CPU)", ref), _first_of_run(rows))


def predictor_peers_cpu() -> list[str]:
    """The slot predictors and the awaited peer's end, all ranks together and rank by rank."""
    data = raw(PREDICTOR_PEERS_CPU)
    ref = data["reference"]
    rows = []
    for run in data["runs"]:
        for who, replayed in [("all ranks", run), *run["ranks"].items()]:
            label = f"{run['run']}: {who if who == 'all ranks' else f'rank {who}'}"
            known = fmt_pct(replayed["with_peer_end"], 0)
            rows += [[*row, known if row[2].startswith("peers") else "—"]
                     for row in _predictor_rows(label, replayed, ref)]  # fmt: skip
    header = [*_predictor_header("run (CPU): ranks", ref), "bubbles with the peer's end"]
    return md_table(header, _first_of_run(rows))


def step_sizes_cpu() -> list[str]:
    rows = []
    for name, task, policy in STEP_SIZES_CPU:
        data = raw(name)
        for run in data["runs"]:
            fixed, fit, diff = run["arms"]["fixed"], run["arms"]["fit"], run["fit_minus_fixed"]
            rows.append([
                f"{task} (rank {run['rank']})", policy,
                f"{run['blocks']} × {run['bubbles_per_block']}",
                f"{data['fixed']} of 4",
                _record_interval(fixed["images_per_s"], 0),
                _record_interval(fit["images_per_s"], 0),
                _record_interval(diff["images_per_s"], 0, signed=True),
                f"{fmt_pct(fixed['under_steps_frac']['value'], 0)} / "
                f"{fmt_pct(fit['under_steps_frac']['value'], 0)}",
            ])  # fmt: skip
    return md_table(
        ["task (CPU replay)", "host's policy", "blocks × bubbles", "fixed arm: slices a step",
         "fixed: images/s of bubble time", "step sizes: images/s", "sizes − fixed [95%]",
         "bubble time under steps: fixed / sizes"],
        rows,
    )  # fmt: skip


def outlived_replay(
    replay: str = OUTLIVED_REPLAY,
    run_names: Sequence[str] = OUTLIVED_RUNS,
    tasks: Mapping[int, str] = OUTLIVED_TASKS,
) -> list[str]:
    """Stop against the survivors (each share of early ones) past a bubble's predicted end,
    replayed over recorded bubbles (``replay``, bench_outlived.py's result): per run and rank,
    stop's figures, then each share's differences from them; ``run_names`` names the runs in
    their order there, ``tasks`` the ranks' tasks."""
    data = raw(replay)
    runs = list(dict.fromkeys(res["run"] for res in data["results"]))
    shares = [name for name in data["results"][0]["arms"] if name != "stop"]
    rows = []
    for res in data["results"]:
        arms = res["arms"]
        rows.append([
            f"{run_names[runs.index(res['run'])]}, rank {res['rank']} · {tasks[res['rank']]}",
            f"{res['guard_ms']:g} ms", f"{res['blocks']} × {res['bubbles'] // res['blocks']}",
            _record_interval(arms["stop"]["plannable_frac"], 1, pct=True),
            _record_interval(arms["stop"]["overrun_frac"], 1, pct=True),
            *(f"{_record_interval(arms[n]['plannable_frac_vs_stop'], 1, pct=True, signed=True)}"
              f" / {_record_interval(arms[n]['overrun_frac_vs_stop'], 0, pct=True, signed=True)}"
              for n in shares),
        ])  # fmt: skip
    return md_table(
        ["run, rank · task", "guard of its smallest step", "blocks × bubbles",
         "stop: bubble time steps may run in", "stop: bubbles that ended with steps allowed "
         "past their end",
         *(f"{OUTLIVED_SHARES[n]}: both, − stop" for n in shares)],
        rows,
    )  # fmt: skip


def boundary_cpu() -> list[str]:
    """Device → edge, the hop before the signal latency, with the boundary bubble opened
    after or before the step's events are written (``BOUNDARY_CPU``; block bootstrap)."""
    rows = []
    for name, arm in BOUNDARY_CPU:
        data = result(name)
        for r in data["pipeline"]:
            if r["mode"] in _AB_MODES:
                rows.append([arm, data["date"][11:16], r["mode"], _ms(r, "announce_p50"),
                             _ms(r, "announce_p99"), _ms(r, "latency_p50"),
                             fmt_frac_interval(r, "harvest_of_measured_idle", 0)])  # fmt: skip
    return md_table(
        ["tree", "UTC", "mode", "device → edge p50 ms", "device → edge p99 ms",
         "edge → step p50 ms", "harvest of the measured idle"],
        rows,
    )  # fmt: skip


def edge_latency_cpu() -> list[str]:
    """Per tree, writer and reader: the bubble-start latency's per-block p50 and p90, the share
    of starts seen within 20 µs, and the reader's CPU time (``EDGE_LATENCY_CPU``)."""

    def iv(x: Mapping[str, float], digits: int, *, pct: bool = False) -> str:
        if pct:  # a share's interval is cut to [0, 1]
            return fmt_interval(x["value"], max(x["lo"], 0.0), min(x["hi"], 1.0), digits)
        return fmt_interval(x["value"], x["lo"], x["hi"], digits, pct=False)

    rows = []
    for name, tree in EDGE_LATENCY_CPU:
        data = raw(name)
        for run in data["runs"].values():
            b = run["start_blocks"]
            rows.append([tree, data["date"][11:16], run["writer"], run["reader"],
                         f"{b['blocks']} × {b['starts_per_block']}", iv(b["p50_us"], 1),
                         iv(b["p90_us"], 1), iv(b["no_wake_frac"], 0, pct=True),
                         fmt_pct(run["reader_cpu_frac"], 0)])  # fmt: skip
    return md_table(
        ["tree (CPU)", "UTC", "writer", "reader", "blocks × starts", "start → seen p50 µs",
         "start → seen p90 µs", "starts seen within 20 µs", "reader CPU"],
        rows,
    )  # fmt: skip


def host_path_cpu() -> list[str]:
    """Per tree: the host's own path from a bubble's start edge to its step() call, and to the
    start its step records (``HOST_PATH_CPU``; means of block percentiles, t-intervals)."""

    rows = []
    for name, tree in HOST_PATH_CPU:
        data = raw(name)
        call, start = data["edge_to_call_us"], data["edge_to_recorded_start_us"]
        rows.append([tree, data["date"][11:16], f"{call['blocks']} × {call['per_block']}",
                     *(_record_interval(x[q], 1) for x in (call, start)
                       for q in ("p50", "p90"))])  # fmt: skip
    return md_table(
        ["tree (CPU)", "UTC", "blocks × bubbles", "edge → step() called p50 µs", "p90 µs",
         "edge → the step's recorded start p50 µs", "p90 µs"],
        rows,
    )  # fmt: skip


def host_path_tail_cpu() -> list[str]:
    """Per tree: the host's path from a bubble's start edge to its step() call, its tail too
    (``HOST_PATH_TAIL_CPU``; means of block percentiles and shares, t-intervals)."""

    rows = []
    for name, tree in HOST_PATH_TAIL_CPU:
        data = raw(name)
        call = data["edge_to_call_us"]
        rows.append([tree, data["date"][11:16], f"{call['blocks']} × {call['per_block']}",
                     *(_record_interval(call[q], 1) for q in ("p50", "p90", "p99")),
                     _record_interval(call["over_1ms_frac"], 2, scale=100.0)])  # fmt: skip
    return md_table(
        ["tree (CPU)", "UTC", "blocks × bubbles", "edge → step() called p50 µs", "p90 µs",
         "p99 µs", "bubbles over 1 ms, %"],
        rows,
    )  # fmt: skip


def host_path_between(
    files: Sequence[tuple[str, str]] = HOST_PATH_BETWEEN_CPU, first: str = "tree (CPU)"
) -> list[str]:
    """Per tree or machine: the host's path from one step's return to the next step's call,
    and the edge → step() path of the same run (means of block percentiles, t-intervals)."""
    rows = []
    for name, tree in files:
        data = raw(name)
        gap, call = data["between_steps_us"], data["edge_to_call_us"]
        rows.append([tree, data["date"][11:16], f"{gap['blocks']} × {gap['per_block']}",
                     *(_record_interval(gap[q], 1) for q in ("p50", "p90", "p99")),
                     _record_interval(call["p50"], 1)])  # fmt: skip
    return md_table(
        [first, "UTC", "blocks × gaps", "step → next step() p50 µs", "p90 µs", "p99 µs",
         "edge → step() called p50 µs"],
        rows,
    )  # fmt: skip


def host_path_cold(files: Sequence[tuple[str, str]] = HOST_PATH_COLD_CPU) -> list[str]:
    """Per setting: the host's path from a bubble's start edge to its step() call, and from the
    edge's publication done to that call (the host alone), after the idle spell the setting
    puts before each bubble ([Note: a cold path] in ``bench_host_path.py``)."""
    rows = []
    for name, label in files:
        data = raw(name)
        call, alone = data["edge_to_call_us"], data["visible_to_call_us"]
        rows.append([label, data["date"][11:16], f"{call['blocks']} × {call['per_block']}",
                     _record_interval(call["p50"], 1),
                     *(_record_interval(alone[q], 1) for q in ("p50", "p90", "p99"))])  # fmt: skip
    return md_table(
        ["before each bubble (CPU)", "UTC", "blocks × bubbles", "edge → step() called p50 µs",
         "the host alone: publication done → step() p50 µs", "p90 µs", "p99 µs"],
        rows,
    )  # fmt: skip


def bubble_floats_table(pairs: Sequence[tuple[tuple[str, str], str]]) -> list[str]:
    """Per call, stage and mode: the share of the stage's bubble time whose float (how far past
    its end a step could run before training's step ends later) is at least 1 and 5 ms, as the
    schedule ran and with the least lags (``bubble_floats.py``: lower and upper bound), and of
    the steps that ran past their bubble's end, how many stayed within its float (as run)."""
    rows = []
    for (_, label), name in pairs:
        for key, modes in raw(name)["stages"].items():
            for mode in ("vanilla", *GATED_MODES):
                if mode not in modes:
                    continue
                s = modes[mode]["summary"]
                low = s["time_frac_float_at_least_ms"]
                high = s["time_frac_float_least_lags_at_least_ms"]
                over = (f"{s['overruns_within_float']} of {s['overruns']}"
                        if mode in GATED_MODES else "—")  # fmt: skip
                rows.append([label, key.rsplit("/", 1)[1], mode, str(s["with_float"]),
                             *(f"{fmt_pct(low[m], 0)} / {fmt_pct(high[m], 0)}" for m in ("1", "5")),
                             over])  # fmt: skip
                label = ""
    return md_table(
        ["", "stage", "mode", "bubbles", "bubble time with a float ≥ 1 ms (as run / least lags)",
         "≥ 5 ms", "steps past the bubble's end: within its float"],
        rows,
    )  # fmt: skip


def action_times_table(pairs: Sequence[tuple[tuple[str, str], str]]) -> list[str]:
    """Per arm, real stage and gated mode: the real rank's actions, summed over a step, against
    the stage's vanilla blocks (``action_times.py``: ms a step and share, 95% intervals), each
    kind's difference, and the action whose median moved most."""
    rows = []
    for (_, label), name in pairs:
        for key, stage in raw(name)["stages"].items():
            if "/instrumentation/" in key:
                continue
            for mode, e in stage["modes"].items():
                if "vs_vanilla_ms" not in e:
                    continue
                d = e["vs_vanilla_ms"]
                top = e["actions"][0] if e["actions"] else None
                rows.append([
                    label, key.rsplit("/", 1)[1], mode,
                    f"{stage['blocks'][mode]} / {stage['blocks']['vanilla']}",
                    _record_interval(e["step_ms"]["all"], 1),
                    _record_interval(d["all"], 2, signed=True),
                    _record_interval(e["vs_vanilla_frac"], 2, pct=True, signed=True),
                    " · ".join(f"{k} {d[k]['value']:+.2f}" for k in sorted(d) if k != "all"),
                    (f"stage {top['stage']} {top['action']}{top['microbatch']}: "
                     f"{top['vanilla_ms']:.2f} → {top['gated_ms']:.2f}") if top else "—",
                ])  # fmt: skip
                label = ""
    return md_table(
        ["", "stage", "mode", "blocks (gated / vanilla)", "actions a step ms",
         "− vanilla ms [95%]", "of vanilla [95%]", "by kind, − vanilla ms",
         "moved most (median ms, vanilla → gated)"],
        rows,
    )  # fmt: skip


#: the roles a run-queue table shows, in this order (``run_queue.py``'s labels)
_RUN_QUEUE_ROLES = ("task host", "pipeline rank", "side-task worker", "bench")


def run_queue_table(pairs: Sequence[tuple[tuple[str, str], str]]) -> list[str]:
    """Per call (each result beside its ``run_queue.py`` record) and role: CPU time, time ready
    but waiting for a CPU (all threads, and the main threads alone), preemptions, and the
    machine's busy and stolen CPU time."""
    rows = []
    for (_, label), name in pairs:
        data = raw(name)
        cpu = data["cpu"]
        for role in _RUN_QUEUE_ROLES:
            r = data["roles"].get(role)
            if r is None:
                continue
            wait, main = r["wait_per_cpu_s"], r["main_wait_per_cpu_s"]
            rows.append([label, role, str(r["processes"]), f"{r['cpu_s']:.1f}",
                         "—" if r["wait_s"] is None else f"{1e3 * r['wait_s']:.1f}",
                         "—" if wait is None else fmt_pct(wait, 2),
                         "—" if main is None else fmt_pct(main, 2),
                         str(r["involuntary_switches"]),
                         fmt_pct(cpu["busy_frac"], 1), fmt_pct(cpu["steal_frac"], 2)])  # fmt: skip
            label = ""
    return md_table(
        ["", "role", "processes", "CPU s", "waited for a CPU ms", "of its CPU time",
         "main threads': of theirs", "preempted (times)", "machine busy", "stolen"],
        rows,
    )  # fmt: skip


def step_gaps(pairs: Sequence[tuple[tuple[str, str], str]]) -> list[str]:
    """From each result's bubble ledger: per stage · task, the time from one of its steps'
    end to its next step's start in the same bubble (ms, median and p90), and the share of
    the stage's bubble time spent so."""
    rows = []
    for (_, label), ledger_name in pairs:
        for key, stage in raw(ledger_name)["stages"].items():
            total = sum(b["length_ms"] for b in stage["bubbles"]) or 1.0
            gaps: dict[str, list[float]] = {}
            for b in stage["bubbles"]:
                for task, steps in steps_by_task(b).items():
                    gaps.setdefault(task, []).extend(gaps_ms(steps))
            for task, ms in sorted(gaps.items()):
                if len(ms) < 10:
                    continue
                p90 = statistics.quantiles(ms, n=10)[-1]
                rows.append([label, f"{key.rsplit('/', 1)[1]} · {task}", str(len(ms)),
                             f"{statistics.median(ms):.3f}", f"{p90:.3f}",
                             fmt_pct(sum(ms) / total, 1)])  # fmt: skip
                label = ""
    return md_table(
        ["", "stage · task", "gaps", "step → next step ms p50", "p90", "of the bubble time"],
        rows,
    )  # fmt: skip


def guard_costs(pairs: Sequence[tuple[tuple[str, str], str]]) -> list[str]:
    """Per result and stage · task (governed blocks): the guard each of its tasks had to clear
    at a bubble's entry (the ledger's median), its steps and overruns over the blocks, the
    overrun time per block, and the p99 step-time inflation with its interval."""
    rows = []
    for (name, label), ledger_name in pairs:
        ledger = raw(ledger_name)["stages"]
        data = result(name)
        for s in data["summary"]:
            if s["mode"] != "governed" or s["case"] != "mix":
                continue
            mine = [b for b in data["blocks"] if b["mode"] == "governed"
                    and b["stage"] == s["stage"] and b["case"] == "mix"]  # fmt: skip
            guards = ledger[f"{s['run']}/{s['stage']}"]["summary"]["guard_at_entry_ms"]
            guard = " + ".join(
                "—" if g is None else f"{g['p50']:.3f}"  # a task that never stepped
                for _, g in sorted(guards.items(), key=lambda kv: kv[0] != s["task"])
            )  # the stage's task first
            steps = sum(int(b["side_steps"]) for b in mine)
            overruns = sum(int(b["overruns"]) for b in mine)
            ms = sum(float(b["overrun_ms_total"]) for b in mine) / max(len(mine), 1)
            task = s["task"] + (f" + {s['leftovers_task']}" if s.get("leftovers_task") else "")
            p99 = (s.get(f"step_p99_inflation{k}_frac") for k in ("", "_lo", "_hi"))
            rows.append([label, f"{s['stage']} · {task}", guard, str(steps),
                         fmt_pct(overruns / steps if steps else None, 1), f"{ms:.1f}",
                         fmt_interval(*p99, signed=True)])  # fmt: skip
            label = ""
    return md_table(
        ["", "stage · task", "guard at entry p50 ms (task + leftovers)", "steps",
         "of them overran", "overrun ms per block", "p99 step-time inflation [95%]"],
        rows,
    )  # fmt: skip


def first_steps() -> list[str]:
    """Each task's first steps in a fresh process, and the p95 a five-step profile takes."""
    rows = []
    for t in raw(FIRST_STEPS_H100)["tasks"]:
        ms, p95 = t["step_ms"], t["profile_p95_ms"]
        rows.append([t["task"], str(t["top_size"]), str(t["warmup_steps"]),
                     " · ".join(f"{x:.2f}" for x in ms[:4]), f"{statistics.median(ms[10:]):.2f}",
                     f"{p95['first_five']:.2f}", f"{p95['next_five']:.2f}"])  # fmt: skip
    return md_table(
        ["task", "largest size", "declared warm-up", "steps 1 · 2 · 3 · 4 ms",
         "steps after the 10th, median ms", "p95 of the first five after the warm-up",
         "of the five after them"],
        rows,
    )  # fmt: skip


def edge_watcher() -> list[str]:
    data = raw(EDGE_WATCHER)
    step, vs = data["step_ms"], data["vs_none_frac"]
    why = {
        "none": "recorder without live edges: no watcher thread",
        "sleep": "today's watcher: synchronize() on a blocking-sync event, GIL released",
        "poll": "the old watcher: query() every 50 µs, taking the GIL each time",
    }
    rows = [
        [mode, f"{step[mode]:.3f}",
         "—" if mode == "none" else fmt_interval(vs[mode]["value"], vs[mode]["lo"],
                                                  vs[mode]["hi"], 1, signed=True),
         why[mode]]
        for mode in ("none", "sleep", "poll")
    ]  # fmt: skip
    return md_table(["watcher", "step ms (mean of blocks)", "vs none [95%]", "what it is"], rows)


def _merged_rows() -> list[tuple[str, dict[str, Any]]]:
    return [("", r) for r in result(H200_MERGED)["pipeline"] if r["case"] == "mix"]


def _tails(summary: list[dict[str, Any]], label: Callable[[dict[str, Any]], str]) -> list[str]:
    """Per stage and mode: the p99 step inflation, board energy per unit, edge latency."""
    rows = [
        [label(r), r["task"], r["mode"],
         fmt_frac_interval(r, "step_p99_inflation", 2, signed=True),
         "—" if r["extra_energy_j_per_unit"] != r["extra_energy_j_per_unit"]
         else f"{r['extra_energy_j_per_unit']:.3g} J per {r['unit'].rstrip('s') or 'unit'}",
         "—" if r["latency_p50_ms"] is None or r["latency_p50_ms"] != r["latency_p50_ms"]
         else f"{r['latency_p50_ms']:.2f} / {r['latency_p99_ms']:.2f}"]
        for r in summary
        if r["case"] == "mix" and r["mode"] != "vanilla"
    ]  # fmt: skip
    return md_table(
        ["", "task", "mode", "p99 step inflation [95%]", "board energy above vanilla",
         "edge → step p50 / p99 ms"],
        rows,
    )  # fmt: skip


def h200_merged_tails() -> list[str]:
    return _tails(result(H200_MERGED)["summary"], lambda r: f"stage {r['stage']}")


def h200_announce_ab() -> list[str]:
    labels = dict(zip(H200_ANNOUNCE, ("every gap", "≥ 1 ms predicted"), strict=True))
    summary = [
        {**r, "_label": labels[name]}
        for name in H200_ANNOUNCE
        for r in result(name)["summary"]
        if r["mode"] in ("managed", "governed")
    ]
    return _tails(summary, lambda r: str(r["_label"]))


def _idle_split(files: Sequence[tuple[str, str]]) -> list[str]:
    """Per file, stage and gated mode: where the bubble time went, and what it bought; where
    the results split the unused bubbles by why (``core.idle_use``), that split too."""
    picked = [
        (label, r)
        for name, label in files
        for r in result(name)["summary"]
        if r["case"] == "mix" and r["mode"] in ("managed", "governed")
    ]
    # the columns of the unused bubbles' split that some row records (each came in its own
    # result version)
    why = [(c, h) for c, h in UNUSED_WHY if any(recorded(r.get(c)) for _, r in picked)]
    tail = [TAIL_PAST] if any(recorded(r.get(TAIL_PAST[0])) for _, r in picked) else []
    rows = [
        [label, f"{r['stage']} · {side_work(r)}", r["mode"],
         *(fmt_pct(r[c], 1) for c in ("bubble_used_frac", "idle_lead_frac", "idle_between_frac",
                                      "idle_tail_frac")),
         *(fmt_pct(r.get(c, float("nan")), 1) for c, _ in tail),
         fmt_pct(r["idle_unused_frac"], 1),
         *(fmt_pct(r.get(c, float("nan")), 1) for c, _ in why),
         fmt_throughput(r),
         fmt_pct(r.get("step_speed_of_solo_frac", float("nan")), 0),
         fmt_frac_interval(r, "harvest_of_measured_idle", 0),
         fmt_frac_interval(r, "overhead", 2, signed=True)]
        for label, r in picked
    ]  # fmt: skip
    return md_table(
        ["", "stage · task", "mode", "steps", "before the first step", "between steps",
         "after the last step", *(header for _, header in tail), "unused bubbles",
         *(header for _, header in why),
         "throughput in bubbles", "its steps' speed, of the task alone",
         "harvest of measured idle [95%]", "overhead [95%]"],
        _first_of_run(rows),
    )  # fmt: skip


def _highest_duty(data: dict[str, Any], stage: int) -> str:
    """The highest trickle duty the governor set on ``stage`` in ``data``'s runs."""
    duties = [
        g["trickle_duty"]
        for run in data["runs"]
        for g in run.get("governor", [])
        if g["stage"] == stage and g.get("mode") == "trickle" and g.get("trickle_duty") is not None
    ]
    return f"{max(duties):g}" if duties else "0"


def _throughput_interval(r: dict[str, Any]) -> str:
    """A row's side-task throughput with its 95% interval over blocks."""
    iv = Interval.of(r["throughput_per_s"], r["throughput_se_per_s"], r["throughput_df"],
                     int(r["blocks"]))  # fmt: skip
    text = f"{fmt_rate(iv.value)} [{fmt_rate(iv.lo)}, {fmt_rate(iv.hi)}] {r['unit']}/s"
    if r.get("leftovers_task"):  # and the work of the task that took its leftovers
        rest = Interval.of(r["leftovers_throughput_per_s"], r["leftovers_throughput_se_per_s"],
                           r["leftovers_throughput_df"], int(r["blocks"]))  # fmt: skip
        text += (
            f" + {fmt_rate(rest.value)} [{fmt_rate(rest.lo)}, {fmt_rate(rest.hi)}] "
            f"{r['leftovers_unit']}/s"
        )
    return text


def _side_by_side(files: Sequence[tuple[str, str]], modes: tuple[str, ...]) -> list[str]:
    """Per file, stage and mode: the work done, what it cost, and where it ran; where a row
    records it, the hand-on's latency to a task on the leftovers too."""
    picked = [
        (label, data, r)
        for name, label in files
        for data in [result(name)]
        for r in data["summary"]
        if r["mode"] in modes
    ]
    handon = any(recorded(r.get("handon_p99_ms")) for _, _, r in picked)
    rows = [
        [label, f"{r['stage']} · {side_work(r)}", r["mode"],
         _highest_duty(data, r["stage"]) if r["mode"] == "trickle" else "—",
         _throughput_interval(r),
         fmt_frac_interval(r, "overhead", 2, signed=True),
         fmt_frac_interval(r, "harvest_of_measured_idle", 0),
         fmt_pct(r["bubble_used_frac"], 0), fmt_pct(r["idle_unused_frac"], 0),
         _ms_or_dash(r.get("latency_p99_ms")),
         *([_ms_or_dash(r.get("handon_p99_ms"))] if handon else [])]
        for label, data, r in picked
    ]  # fmt: skip
    return md_table(
        ["", "stage · task", "mode", "highest trickle duty", "throughput [95%]", "overhead [95%]",
         "harvest of measured idle [95%]", "bubble time under steps", "unused bubbles",
         "edge → step p99 ms",
         *(["bubbles left whole: edge → leftovers step p99 ms"] if handon else [])],
        _first_of_run(rows),
    )  # fmt: skip


def _ms_or_dash(value: Any) -> str:
    """Milliseconds to two decimals, "—" where not measured."""
    return f"{value:.2f}" if recorded(value) else "—"


def graphed_steps() -> list[str]:
    """Eager vs graphed step of each vision task, per number of slices a batch."""
    rows = [
        [r["task"], str(r["micro_batches"]), str(r["slice_images"]),
         f"{r['eager_step_ms_median']:.2f}", f"{r['graphed_step_ms_median']:.2f}",
         fmt_rate(r["eager_samples_per_s"]), fmt_rate(r["graphed_samples_per_s"]),
         fmt_interval(r["speedup_frac"], r["speedup_low"], r["speedup_high"], 0, signed=True)]
        for r in raw(GRAPHED_STEPS)["rows"]
    ]  # fmt: skip
    return md_table(
        ["task", "slices a batch", "images a step", "eager step ms", "graphed step ms",
         "eager samples/s", "graphed samples/s", "speed-up [95%]"],
        rows,
    )  # fmt: skip


def schedules(files: Sequence[tuple[str, str]] = H200_SCHEDULES) -> list[str]:
    """Per schedule and gated mode: theory vs measured idle, and the share of each harvested."""
    rows = [
        [label, f"{r['stage']} · {r['task']}", r["mode"], fmt_pct(r["bubble_limit_frac"], 1),
         fmt_pct(r["vanilla_idle_frac"], 1), _throughput_interval(r),
         fmt_frac_interval(r, "harvest_of_measured_idle", 0),
         fmt_frac_interval(r, "harvest_of_theory_limit", 0),
         fmt_frac_interval(r, "overhead", 2, signed=True)]
        for name, label in files
        for r in result(name)["summary"]
        if r["mode"] in ("managed", "governed")
    ]  # fmt: skip
    return md_table(
        ["schedule", "stage · task", "mode", "theory idle", "measured idle (vanilla)",
         "throughput [95%]", "harvest of measured idle [95%]", "harvest of theory idle [95%]",
         "overhead [95%]"],
        _first_of_run(rows),
    )  # fmt: skip


def emulated_idle() -> list[str]:
    """Per emulation version, schedule and wire width: measured idle per rank beside theory,
    where the bubble time went (ms per step, mean over ranks), and the actions' median costs."""
    rows = []
    for name, label in EMULATED_IDLE:
        for r in raw(name)["results"]:
            ranks = r["per_rank"]
            if not ranks:
                continue
            costs: dict[str, list[float]] = {}
            for a in r["action_ms"]:
                costs.setdefault(a["action"], []).append(a["median_ms"])
            mean = {k: sum(x[k] for x in ranks) / len(ranks) for k in
                    ("schedule_ms_per_step", "peer_ms_per_step", "host_ms_per_step")}  # fmt: skip
            rows.append([
                label, r["schedule"], str(r.get("wire_d_model", 256)), fmt_pct(r["theory_frac"], 1),
                " / ".join(fmt_pct(x["measured_frac"], 0) for x in ranks),
                f"{mean['schedule_ms_per_step']:.0f}", f"{mean['peer_ms_per_step']:.0f}",
                f"{mean['host_ms_per_step']:.0f}",
                "; ".join(f"{k} " + "/".join(f"{v:.0f}" for v in costs[k])
                          for k in ("F", "B", "I", "W") if k in costs),
            ])  # fmt: skip
    return md_table(
        ["peers", "schedule", "wire width", "theory idle", "measured idle, ranks 0/1/2/3",
         "schedule ms/step", "peer ms/step", "host ms/step", "median action ms, ranks 0/1/2/3"],
        rows,
    )  # fmt: skip


@cache
def source(*names: str) -> Source:
    """A bench run measured in one call or over several, as one result: named by its files,
    dated by its last call, its tables by today's arithmetic."""
    return Source(" + ".join(n.removesuffix(".json") for n in names),
                  max(raw(n)["date"] for n in names),
                  result(names[0]) if len(names) == 1 else merged(names))  # fmt: skip


def _h100_rows() -> list[tuple[str, dict[str, Any]]]:
    return mix_rows(merged(tuple(name for name, _ in H100_HEADLINE)))


def _latency_12_06() -> list[tuple[str, dict[str, Any]]]:
    """The signal latency of the 2026-12-06 H100 calls, the runs over every stage beside their
    stages 1-3 (like with like for the runs over those stages)."""
    s123 = (1, 2, 3)
    return [
        *_pipeline_rows((H100_M4_ALL,)),
        *mix_rows(on_stages(H100_M4_ALL[0], s123), "M = 4, stages 1-3"),
        *_pipeline_rows((H100_SPIN4, H100_M8_ALL)),
        *mix_rows(on_stages(H100_M8_ALL[0], s123), "M = 8, stages 1-3"),
        *_pipeline_rows((H100_M8_FINE, *H100_EDGE_FIRST, H100_DRAIN_FIRST)),
    ]


def slots_against_the_guard(files: Sequence[tuple[str, str]]) -> list[str]:
    """Per file and segment: the stage's bubbles per slot as its vanilla blocks
    predict them (``stage_bubbles_ms``, sorted), beside the task's smallest step and that step's
    guard, each its whole step's (solo p95, the governed guard) over the number of smallest
    steps in it, as the host takes them before it has timed the sizes; and how many slots fall
    below the step, or fit the step but not its guard."""
    rows = []
    for name, label in files:
        for seg in result(name)["runs"][0]["segments"]:
            slots, top = seg.get("stage_bubbles_ms"), seg.get("top_step_size")
            if not slots or not top:
                continue
            step = seg["solo_step_ms_p95"] / top
            guard = sized_budget_ns(round(seg["tight_budget_ms"] * 1e6), 1, top, None, None) / 1e6
            rows.append([
                label, f"{seg['stage']} · {seg['task']}",
                ", ".join(f"{x:.1f}" for x in sorted(slots)), f"{step:.1f}", f"{guard:.1f}",
                f"{sum(x <= step for x in slots)} of {len(slots)}",
                f"{sum(step < x <= guard for x in slots)} of {len(slots)}",
            ])  # fmt: skip
    return md_table(
        ["", "stage · task", "bubbles per slot, predicted from vanilla blocks (ms)",
         "smallest step ms", "its guard ms", "slots under the step", "slots within the guard"],
        _first_of_run(rows),
    )  # fmt: skip


def signal_latency(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Per run and mode: bubble edge → first side-task step, the part of it before the task's
    host saw the edge, the hop before the edge (the device at the bubble's start → the rank's
    announcement; where recorded) and bubble end → the last step started after it (block
    bootstrap)."""
    lag = any(isinstance(r.get("announce_p50_ms"), float) for _, r in rows)
    spin = any(recorded(r.get(f)) for _, r in rows for f in SPIN_COLUMNS)
    names = ("latency_p50", "latency_p99", "wake_p50", "wake_p99",
             *(("announce_p50", "announce_p99") if lag else ()), "pause_p99")  # fmt: skip
    return md_table(
        ["run", "mode", "edge → step p50 ms", "edge → step p99 ms", "of which edge → host p50 ms",
         "edge → host p99 ms",
         *(("before it, device → edge p50 ms", "device → edge p99 ms") if lag else ()),
         "end → last late step p99 ms", *(SPIN_HEADERS if spin else ())],
        _first_of_run([[label or run_label(r["run"]), r["mode"], *(_ms(r, n) for n in names),
                        *(spin_cells(r) if spin else ())]
                       for label, r in rows]),
    )  # fmt: skip


def h100_goal_sources() -> list[Source]:
    """Every H100 bench result BENCHMARKS.md reports: the four-stage headline (two calls read as
    one), and each lever's arm; of 12-07f, the package's arms only (its other arms ran an
    older package after them, and "latest" would read that)."""
    return [
        source(*(n for n, _ in H100_HEADLINE)),
        source(*(n for n, _ in H100_FEEDBACK)),
        *(source(n) for n, _ in (*H100_FIT_SLICES, *H100_M8)),
        source(*(n for n, _ in (*H100_ZB, *H100_ZB_S3))),
        *(source(n) for n, _ in H100_SIZES),
        *(source(n) for n, _ in (*H100_SPIN, *H100_SIGNALS, *H100_SLICES8, *H100_M8_SIZED,
                                 H100_M4_ALL, H100_M8_ALL, H100_M8_FINE, H100_SPIN4,
                                 *H100_EDGE_FIRST, *H100_12_06B, *H100_12_06C,
                                 *H100_12_06D, *H100_12_06E, *H100_12_06G, *H100_12_07,
                                 *H100_12_07B, *H100_12_07C, H100_K_ZB_PROFILE,
                                 H100_K_M8_PROFILE, *H100_12_07E, H100_M_ZB_ON, H100_M_M8_ON,
                                 *H100_12_07G, *H100_12_08)),
        source(*(n for n, _ in H100_ZB_SIZED)),
    ]  # fmt: skip


def _pipeline_rows(files: Sequence[tuple[str, str]]) -> list[tuple[str, dict[str, Any]]]:
    """Each file's pipeline rows of the mix case, labelled by the file's label."""
    return [row for name, label in files for row in mix_rows(result(name), label)]


def _labelled_rows(files: Sequence[tuple[str, str]]) -> list[tuple[str, dict[str, Any]]]:
    """``_pipeline_rows`` with each row's run named by its file's label (two files of one run
    name, the two arms of a lever, read apart)."""
    return [(label, {**r, "run": label}) for label, r in _pipeline_rows(files)]


def goal_sources() -> list[Source]:
    """Every H200 result the tables above report, for "Where each goal stands": the bench
    results (a run measured over several calls read as one, dated by its last call) and the
    timing benchmarks."""
    runs: list[tuple[str, ...]] = [(H200_M4,), (H200_M8,), H200_SPLIT, (H200_INSTRUMENT,),
                                   (H200_MERGED,), *((n,) for n in H200_ANNOUNCE),
                                   tuple(n for n, _ in H200_IDLE_SPLIT),
                                   (H200_PLACEMENT,)]  # fmt: skip
    for files in (H200_LEVERS, H200_TRICKLE, H200_INFERENCE, H200_INFERENCE_TOKENS, H200_GRAPHS,
                  H200_MPS_GRAPHS, H200_SCHEDULES, H200_ZB_EMULATION):  # fmt: skip
        runs += [(n,) for n, _ in files if (n,) not in runs]
    out = [source(*names) for names in runs]
    out += [
        Source(n.removesuffix(".json"), raw(n)["date"], raw(n))
        for n in (*TIMING_OVERHEAD, *TIMING_OVERHEAD_C, TIMING_OVERHEAD_D)
    ]
    return out


def goals_now() -> list[str]:
    return goal_table(goal_sources(), peer_fix_date=raw(PEER_FIX)["date"])


def _on_off(on: tuple[str, str], off: tuple[str, str], where: str) -> list[Comparison]:
    """A lever on (file, label) against off (file, label), two invocations of one call, in
    each of ``_AB_MODES``; ``where`` says where BENCHMARKS.md shows them."""
    return [
        c
        for mode in _AB_MODES
        for c in bench_comparisons(Arm(source(on[0]), mode, on[1]),
                                   Arm(source(off[0]), mode, off[1]), where)
    ]  # fmt: skip


def _predictor() -> list[Comparison]:
    """The feedback predictor against FreeRide's minimum on the H100, per pair of stages, then
    at M = 8 with the peers held fixed."""
    pairs = zip(H100_FEEDBACK, H100_HEADLINE, strict=True)
    return [
        *(c for on, off in pairs for c in _on_off(on, off, _H100_IDLE)),
        *_on_off(H100_D_FEEDBACK, H100_D_MIN, "table `h100-12-06d-stages`"),
    ]


def _modes(names: tuple[str, ...], on: str, off: str, table: str) -> list[Comparison]:
    """A lever on (mode ``on``) against off (mode ``off``) within each segment of one result."""
    s = source(*names)
    return bench_comparisons(Arm(s, on, on), Arm(s, off, off), f"table `{table}`")


def _governed() -> list[Comparison]:
    """Governed against managed blocks over the four stages of one run (``H200_IDLE_SPLIT``):
    per stage, then the pipeline's mean."""
    s = source(*(n for n, _ in H200_IDLE_SPLIT))
    on, off = Arm(s, "governed", "governed"), Arm(s, "managed", "managed")
    return [
        *bench_comparisons(on, off, "table `h200-12-04d-idle-split`"),
        *pipeline_comparisons(on, off, "tables `h200-12-04d-harvest`, `h200-12-04d-overhead`"),
    ]


def _timing_quiet(model: str, label: str) -> Comparison:
    """The instrument's cost with only bubbles predicted ≥ 1 ms announced against every gap
    announced (``TIMING_OVERHEAD_C``), on one model."""
    on, off = (raw(f"timing-overhead-h200-2026-12-04c-{model}-announce{ms}.json") for ms in (1, 0))
    return paired_comparison(
        "`timing-overhead-h200-2026-12-04c-*-announce1` vs `…-announce0` (every gap): the "
        "instrument's cost; table `timing-overhead-h200-quiet`",
        f"{label}, no side task: timed vs plain step",
        on["cases"][0]["overhead_frac"], off["cases"][0]["overhead_frac"], (),
    )  # fmt: skip


def lever_comparisons() -> dict[str, list[Comparison]]:
    """Each lever's committed A/Bs (``lever_status.LEVERS``), from the files the tables above
    report: on beside off in one call, per stage · task."""
    group0, group1, micro1, micro4 = H200_LEVERS
    resnet_eager, resnet_graphed, vgg_eager, vgg_graphed = H200_GRAPHS
    interleaved, zero_bubble = H200_SCHEDULES
    every_gap, quiet = ((n, label) for n, label in zip(H200_ANNOUNCE, ("every gap", "≥ 1 ms"),
                                                          strict=True))  # fmt: skip
    watcher = raw(EDGE_WATCHER)
    tokens = H200_INFERENCE_TOKENS[0]
    return {
        "governed": _governed(),
        "micro_batches": _on_off(micro4, micro1, "table `h200-12-04d-levers`"),
        "step_groups": [*_on_off(group1, group0, "table `h200-12-04d-levers`"),
                        *_on_off(H100_J_G2, H100_J_G1, "table `h100-12-07c-stages`")],
        "group_guard": [*_on_off(H100_L_CALL_A, H100_L_GROUP_A, "table `h100-12-07e-stages`"),
                        *_on_off(H100_L_CALL_B, H100_L_GROUP_B, "table `h100-12-07e-stages`")],
        "image_bands": [*_on_off(H100_M_ZB_ON, H100_M_ZB_OFF, "table `h100-12-07f-stages`"),
                        *_on_off(H100_M_M8_ON, H100_M_M8_OFF, "table `h100-12-07f-stages`")],
        "predictor": _predictor(),
        "outlived": [*_on_off(H100_D_SURVIVORS, H100_D_STOP, "table `h100-12-06d-stages`"),
                     *_on_off(H100_H_SURVIVORS, H100_H_STOP, "table `h100-12-07-stages`")],
        "outlived_hand_on": [*_on_off(H100_N_ZB_ON, H100_N_ZB_OFF, "table `h100-12-07g-stages`"),
                             *_on_off(H100_N_M8_ON, H100_N_M8_OFF, "table `h100-12-07g-stages`")],
        "leftovers": [*_on_off(H100_E_M8_ON, H100_E_M8_OFF, "table `h100-12-06e-stages`"),
                      *_on_off(H100_E_M4_ON, H100_E_M4_OFF, "table `h100-12-06e-stages`"),
                      *_on_off(H100_F_ON, H100_F_OFF, "table `h100-12-06g-stages`"),
                      *_on_off(H100_G_ON, H100_G_OFF, "table `h100-12-06g-stages`"),
                      *_on_off(H100_G3_ON, H100_G3_OFF, "table `h100-12-06g-stages`"),
                      *(c for c in _on_off(H100_J_ZB_ON, H100_J_ZB_OFF,
                                           "table `h100-12-07c-stages`")
                        if "(leftovers)" in c.where)],  # the image task's own stage: no A/B
        "step_sizes": [*_on_off(H100_FIT_SLICES[0], H100_HEADLINE[1], _H100_IDLE),
                       *_on_off(H100_SIZES[1], H100_SIZES[0], "table `h100-12-05c-sizes`"),
                       *_on_off(H100_SLICES8[0], H100_SPIN[0], "table `h100-12-05d-stages`"),
                       *_on_off(H100_M8_FINE, H100_M8_ALL, "table `h100-12-06-stages`"),
                       *_on_off(H100_C_M4_FINE, H100_C_M4_OFF, "table `h100-12-06c-stages`"),
                       *_on_off(H100_C_M8_FINE, H100_C_M8_OFF, "table `h100-12-06c-stages`")],
        "power": _on_off(H100_SIGNALS[1], H100_SIGNALS[0], "table `h100-12-05d-stages`"),
        "graphs": [*_on_off(resnet_graphed, resnet_eager, "table `h200-12-04f-graphs`"),
                   *_on_off(vgg_graphed, vgg_eager, "table `h200-12-04f-graphs`")],
        "trickle": [*(c for name, _ in H200_TRICKLE
                      for c in _modes((name,), "trickle", "governed", "h200-12-04e-trickle")),
                    *_modes((tokens[0],), "trickle", "governed", "h200-12-04f-inference")],
        "edge_waits": [
            *_on_off(H200_SPIN[1], H200_SPIN[0],
                     "no table; 2026-12-03, \"What changed since the first H200 call\", 5"),
            paired_comparison(
                f"`{EDGE_WATCHER.removesuffix('.json')}`: sleeping vs polling watcher, each "
                "against no watcher; table `edge-watcher-h200`",
                "launch-bound loop, no side task: step time vs no watcher",
                watcher["vs_none_frac"]["sleep"], watcher["vs_none_frac"]["poll"],
                (Source(EDGE_WATCHER.removesuffix(".json"), watcher["date"], watcher),)),
        ],
        "announce": [*_on_off(quiet, every_gap, "table `h200-12-04c-announce`"),
                     _timing_quiet("launch", "one-stage GPT, d_model 1024 (launch-bound)"),
                     _timing_quiet("compute", "one-stage GPT, d_model 2048 (compute-bound)")],
        "inference": bench_comparisons(Arm(source(tokens[0]), "governed", tokens[1]), None,
                                       "table `h200-12-04f-inference`"),
        "spin_window": [*_on_off(H100_SPIN[0], H100_SPIN[1],
                                 "tables `h100-12-05d-latency`, `h100-12-05d-stages`"),
                        *_on_off(H100_SPIN4, H100_M4_ALL,
                                 "tables `h100-12-06-latency`, `h100-12-06-stages`")],
        "evidence": _on_off(H100_GOV_EVIDENCE, H100_GOV_MEAN, "table `h100-12-06b-stages`"),
        "guard": [*_on_off(H100_GUARD_P95, H100_GUARD_DEFAULT, "table `h100-12-06b-stages`"),
                  *_on_off(H100_C_M4_GUARD, H100_C_M4_OFF, "table `h100-12-06c-stages`"),
                  *_on_off(H100_C_M8_GUARD, H100_C_M8_OFF, "table `h100-12-06c-stages`")],
        "edge_first": [c for on in H100_EDGE_FIRST
                       for c in _on_off(on, H100_DRAIN_FIRST,
                                        "tables `h100-12-06-latency`, `h100-12-06-stages`")],
        "placement": [
            *placement_comparisons(source(H200_PLACEMENT),
                                   "tables `h200-12-06-placement`, `-placement-cells`"),
            *placement_comparisons(
                Source(f"{H200_PLACEMENT.removesuffix('.json')}, read with slices",
                       raw(H200_PLACEMENT)["date"], _with_slices(H200_PLACEMENT)),
                "table `h200-12-06-placement-sliced` (the placer that knows slices)"),
        ],
        "zero_bubble": _on_off(zero_bubble, interleaved, "table `h200-12-04f-schedules`"),
    }  # fmt: skip


def placement_policies(data: Mapping[str, Any]) -> list[str]:
    """Each placement policy's assignment of a result's tasks and the harvest read off its
    cells, beside the best and worst assignment in hindsight."""
    rows = [placement_cells(r)[1:] for r in data["placement"]]
    return md_table(PLACEMENT_HEADERS[1:], rows)


@cache
def _with_slices(name: str) -> dict[str, Any]:
    """A result recorded before task hosts reported how many slices their profiled step was,
    with that count set from the run's own task options, as the tasks derive it (``fit_slices``
    steps of 1, 2, 4, ... slices up to ``micro_batches``; the image task's up to
    ``step_bands``; every other task's steps whole), its tables recomputed."""
    data = copy.deepcopy(raw(name))
    options = data["config"]["task_options"]

    def top(task: str) -> int:
        o = options.get(task, {})
        if o.get("fit_slices"):
            return doubling_sizes(int(o.get("micro_batches", 1)))[-1]
        if task == "image":
            return doubling_sizes(min(int(o.get("step_bands", 1)), int(o.get("bands", 1))))[-1]
        return 1

    for run in data["runs"]:
        for seg in run.get("segments", []):
            if seg.get("task") and seg.get("top_step_size") is None:
                seg["top_step_size"] = top(seg["task"])
    return _recomputed(data)


def placement_cells_table(name: str = H200_PLACEMENT, mode: str = "governed") -> list[str]:
    """The cells a placement's harvest is read off: each task's harvest of the measured idle
    and overhead on each stage, and the bubble time per training step its steps should fill
    there by the placer's prediction (``core.placement.usable_ms``)."""
    data = result(name)
    cells = {(r["task"], int(r["stage"])): r for r in data["summary"]
             if r["mode"] == mode and r["case"] == r["task"]}  # fmt: skip
    stages = sorted({s for _, s in cells})
    tasks = list(dict.fromkeys(t for t, _ in cells))
    fill = predicted_fill_ms(data["runs"], data["runs"][0]["name"], mode)

    def cell(task: str, stage: int) -> str:
        r = cells.get((task, stage))
        if r is None:
            return "—"
        return (f"{fmt_frac_interval(r, 'harvest_of_measured_idle', 0)} · "
                f"{fmt_frac_interval(r, 'overhead', 2, signed=True)} · "
                f"{fmt_num(fill.get((task, stage)), '.0f')} ms")  # fmt: skip

    return md_table(["task", *(f"stage {s}" for s in stages)],
                    [[t, *(cell(t, s) for s in stages)] for t in tasks])  # fmt: skip


def levers_now() -> list[str]:
    return lever_table(lever_comparisons(), peer_fix_date=raw(PEER_FIX)["date"])


def image_bands() -> list[str]:
    """The image task's band steps on the GPU, channel by channel against all channels at once
    (``benchmarks/bench_image_bands.py``)."""
    data = raw(IMAGE_BANDS)
    ways = [(k, data[f"per_channel/{k}"], data[f"all_channels/{k}"]) for k in (1, 2, 4, 8)]
    same = "the same" if data["equal"] else "not the same"
    return [
        *md_table(
            ["bands a step", "channel by channel: step ms (p90)", "launches ms",
             "all channels at once: step ms (p90)", "launches ms"],
            [[k, f"{old['median_ms']:.2f} ({old['p90_ms']:.2f})", f"{old['launch_median_ms']:.2f}",
              f"{new['median_ms']:.2f} ({new['p90_ms']:.2f})", f"{new['launch_median_ms']:.2f}"]
             for k, old, new in ways],
        ),
        f"\n{data['device']}; the two ways' bands are {same} bit for bit.",
    ]  # fmt: skip


def image_band_ways(name: str) -> list[str]:
    """The image task's band step on the GPU, four ways (``benchmarks/bench_image_bands.py``):
    step time (p90) and launch time per way and bands a step, and how the ways' bands agree."""
    data = raw(name)
    ways = ("per_channel", "all_channels", "blocks", "graphed")
    rows = [[k, *(f"{data[f'{w}/{k}']['median_ms']:.2f} ({data[f'{w}/{k}']['p90_ms']:.2f}) · "
                  f"{data[f'{w}/{k}']['launch_median_ms']:.2f}" for w in ways)]
            for k in (1, 2, 4, 8)]  # fmt: skip
    same = {True: "the same", False: "not the same"}
    return [
        *md_table(
            ["bands a step", "tap by tap, channel by channel: step ms (p90) · launches ms",
             "tap by tap, all channels at once", "columns in blocks", "columns in blocks, graphed"],
            rows,
        ),
        f"\n{data['device']}. Channel by channel and all channels at once give "
        f"{same[data['equal']]} band bit for bit; the graphed band is "
        f"{same[data['graphed_equal']]} as the eager blocks' bit for bit; the blocks' band "
        f"lies within {data['blocks_max_abs_diff']:.1e} of the tap-by-tap one in float, and "
        f"{fmt_pct(data['blocks_uint8_differ_frac'], 3)} of its pixels differ once rounded to "
        "uint8 (an 8-band step of 1,024 rows).",
    ]  # fmt: skip


def state_copy() -> list[str]:
    """Taking a vision task's state on its host's thread, pageable against pinned
    (``benchmarks/bench_state_copy.py``)."""
    data = raw(STATE_COPY)
    return [
        *md_table(
            ["task", "state", "pageable, tensor by tensor: first ms", "median ms (highest)",
             "pinned, one wait: first ms", "median ms (highest)"],
            [[r["task"], f"{r['state_bytes'] / 1e9:.2f} GB", f"{r['pageable']['first_ms']:.0f}",
              f"{r['pageable']['median_ms']:.0f} ({r['pageable']['max_ms']:.0f})",
              f"{r['pinned']['first_ms']:.0f}",
              f"{r['pinned']['median_ms']:.1f} ({r['pinned']['max_ms']:.1f})"]
             for r in data["rows"]],
        ),
        f"\n{data['device']}, torch {data['torch']}.",
    ]  # fmt: skip


def state_copy_in_flight() -> list[str]:
    """The state's copy three ways (``benchmarks/bench_state_copy.py``): what each holds the
    host's thread, and when the copies left in flight had landed."""
    data = raw(STATE_COPY_INFLIGHT)

    def way(r: Mapping[str, Any], key: str) -> str:
        w = r[key]
        return f"{w['first_ms']:.1f} / {w['median_ms']:.1f} ({w['max_ms']:.1f})"

    return [
        *md_table(
            ["task", "state", "pageable, tensor by tensor", "pinned, one wait",
             "in flight: the host held", "in flight: landed"],
            [[r["task"], f"{r['state_bytes'] / 1e9:.2f} GB",
              *(way(r, k) for k in ("pageable", "pinned", "in_flight", "landed"))]
             for r in data["rows"]],
        ),
        f"\nEach: first take / median of the others (highest), ms; {data['device']}, torch "
        f"{data['torch']}.",
    ]  # fmt: skip


def host_stalls(name: str) -> list[str]:
    """The stages of committed ledgers with a stall (``benchmarks/host_stalls.py``): a run of
    announced bubbles with room that no task took, back to back; then how many stages had
    none."""
    data = raw(name)
    rows, clear = [], 0
    for ledger, stages in data["ledgers"].items():
        call = ledger.removeprefix("h100-").removesuffix(".json").replace("-ledger-", " ")
        for key, stage in stages.items():
            if not stage["stalls"]:
                clear += 1
                continue
            for s in stage["stalls"]:
                rows.append([
                    call, key, f"{stage['room_ms']:.2f}", f"{stage['bubble_ms']:,.0f}",
                    f"{s['mode']} block {s['repeat'] + 1}, step {s['step']} slot {s['slot']}",
                    str(s["bubbles"]), f"{s['ms']:.0f}", fmt_pct(s["ms"] / stage["bubble_ms"], 1),
                    fmt_pct(s["block_frac"], 0),
                ])  # fmt: skip
    ledgers = len(data["ledgers"])
    if not rows:
        return [f"No stall on any of the {clear} stages of {_count(ledgers, 'ledger')}."]
    return [
        *md_table(
            ["call (H100)", "run/stage", "room ms", "gated bubble ms", "the stall",
             f"bubbles (≥ {data['min_bubbles']})", "ms", "of the stage's bubble time",
             "of its block's"],
            rows,
        ),
        f"\nNo stall on the other {clear} stages of {_count(ledgers, 'ledger')}.",
    ]  # fmt: skip


def _count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural past one: "1 ledger", "26 ledgers"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def step_speed(pairs: Sequence[tuple[tuple[str, str], str]]) -> list[str]:
    """Each real stage's tasks' steps in the bubbles by size (their progress), from each
    result's bubble ledger (``benchmarks/bubble_ledger.py``): the median step time, the speed
    at it, and that speed against the task's own alone on the device (the segment's
    dedicated speed, measured at the host's largest step)."""
    rows = []
    for (name, label), ledger_name in pairs:
        ledger, alone = raw(ledger_name), _speeds_alone(result(name))
        for key, stage in ledger["stages"].items():
            r = int(key.rsplit("/", 1)[1])
            for task, sizes in stage["summary"].get("step_ms_by_progress", {}).items():
                speed, unit = alone.get((r, task), (None, None))
                for progress, q in sizes.items():
                    per_s = float(progress) / q["p50"] * 1e3
                    of_alone = fmt_pct(per_s / speed, 0) if speed else "—"
                    rows.append([label, f"{r} · {task}", progress + (f" {unit}" if unit else ""),
                                 str(q["steps"]), f"{q['p50']:.2f} ({q['p90']:.2f})",
                                 fmt_rate(per_s), of_alone])  # fmt: skip
                    label = ""  # a task with no steps in bubbles leaves the label
    return md_table(
        ["", "stage · task", "a step's progress", "steps in bubbles", "step ms p50 (p90)",
         "speed at p50 /s", "of its speed alone"],
        rows,
    )  # fmt: skip


def harvest_ceiling(pairs: Sequence[tuple[tuple[str, str], str]]) -> list[str]:
    """Each real stage's announced bubbles replayed through its hosts' step rule
    (``benchmarks/harvest_ceiling.py``): what the blocks harvested, the replay to the rank's
    predictions (the model's check), to each bubble's true end, without the guard's margin,
    and that replay's time under steps; then what each change bought, in points [95%]."""
    rows = []
    for (_, label), name in pairs:
        for key, stage in raw(name)["stages"].items():
            s, c = stage["summary"], stage["costs"]
            tasks = stage["main"] + (f" + {stage['leftovers']}" if stage["leftovers"] else "")
            rows.append([label, f"{key.rsplit('/', 1)[1]} · {tasks}", str(len(stage["blocks"])),
                         *(fmt_interval(s[a]["value"], s[a]["lo"], s[a]["hi"], 0)
                           for a in CEILING_ARMS),
                         *(_points(c[what]) for what in (*COSTS, BEYOND))])  # fmt: skip
            label = ""
    return md_table(
        ["", "stage · task", "blocks", "harvested", "replayed: to the rank's prediction",
         "to each bubble's true end", "and no guard margin", "its time under steps",
         "the model's error (pts)", "the prediction (pts)", "the guard's margin (pts)",
         "the steps' speed (pts)", "beyond any step rule (pts)"],
        rows,
    )  # fmt: skip


def call_guard_replay(arms: Sequence[tuple[str, str, str]], task: str = "pagerank") -> list[str]:
    """``task``'s stages replayed to the rank's predictions (``harvest_ceiling.py``) on the
    guard its blocks had and on another (``--guard-ms``): each one's harvest, the paired
    difference per block [95%], and the share of the replayed steps that end past their
    bubble's end. ``arms``: (the replay on the block's guard, the replay on the other, label)."""
    rows = []
    for own_name, other_name, label in arms:
        own, other = raw(own_name), raw(other_name)
        for key, stage in own["stages"].items():
            if stage["main"] != task:
                continue
            a, b = stage["blocks"], other["stages"][key]["blocks"]
            gain = mean_interval(
                [y["predicted"] - x["predicted"] for x, y in zip(a, b, strict=True)]
            )
            s, t = stage["summary"], other["stages"][key]["summary"]
            tasks = stage["main"] + (f" + {stage['leftovers']}" if stage["leftovers"] else "")
            rows.append([label, f"{key.rsplit('/', 1)[1]} · {tasks}", str(len(a)),
                         *(fmt_interval(x["predicted"]["value"], x["predicted"]["lo"],
                                        x["predicted"]["hi"], 0) for x in (s, t)),
                         _points(gain.record()),
                         *(fmt_pct(x[OVERRUN]["value"], 1) for x in (s, t))])  # fmt: skip
    guard = next(iter(raw(arms[0][1])["guard_ms"].values()))
    return md_table(
        ["", "stage · task", "blocks", "replayed on its blocks' guard",
         f"on a guard of {guard:g} ms", "difference (pts)", "steps past the bubble's end",
         f"on {guard:g} ms"],
        rows,
    )  # fmt: skip


def _points(one: Mapping[str, float]) -> str:
    """A share's difference [95%] in percentage points: "+7.0 [+4.4, +9.6]"."""
    v, lo, hi = (100 * one[k] for k in ("value", "lo", "hi"))
    return f"{v:+.1f} [{lo:+.1f}, {hi:+.1f}]"


def _speeds_alone(data: Mapping[str, Any]) -> dict[tuple[int, str], tuple[Any, Any]]:
    """(stage, task) → (its dedicated speed, its unit) for each segment's task and the task
    on its leftovers (whose unit its blocks record)."""
    units = {(b["stage"], b["leftovers_task"]): b["leftovers_unit"]
             for b in data["blocks"] if b.get("leftovers_unit")}  # fmt: skip
    segments = (s for run in data["runs"] for s in run["segments"] if s.get("task"))
    return {(seg["stage"], one["task"]): (one.get("dedicated_per_s"),
                                          units.get((seg["stage"], one["task"]), one.get("unit")))
            for seg in segments for one in segment_tasks(seg) if one.get("task")}  # fmt: skip


def pin_ahead_table(names: Sequence[str]) -> list[str]:
    """A task's state's host blocks pinned from a thread while another thread runs a loop
    (``bench_state_copy.py --pin-ahead``): what the pinning took, the loop's longest turn and
    the first take after it."""
    rows = []
    for name in names:
        data = raw(name)
        for r in data["rows"]:
            ahead = r["pin_ahead"]
            rows.append([r["task"], ahead.get("beside", "python"),
                         f"{r['state_bytes'] / 1e9:.2f} GB", f"{ahead['bytes'] / 1e9:.2f} GB",
                         f"{ahead['tensors']}", f"{ahead['ms']:.0f}",
                         f"{ahead['main_thread_longest_gap_ms']:.2f}",
                         f"{r['pinned']['first_ms']:.1f}", data["device"]])  # fmt: skip
    return md_table(
        ["task", "the other thread's loop", "state", "pinned (blocks rounded up)", "blocks",
         "pinning ms", "the loop's longest turn ms", "then the first pinned take ms", "device"],
        rows,
    )  # fmt: skip


TABLES: dict[str, Callable[[], list[str]]] = {
    "h100-goals-now": lambda: goal_table(h100_goal_sources(), peer_fix_date=raw(PEER_FIX)["date"]),
    "h100-12-05-overhead": lambda: h200_overhead(_h100_rows()),
    "h100-12-05-harvest": lambda: h200_harvest(_h100_rows()),
    "h100-12-05-latency": lambda: signal_latency(_h100_rows()),
    "h100-12-05-per-stage": lambda: _per_stage(
        merged(tuple(n for n, _ in H100_HEADLINE))["summary"], ("mix", "instrumentation")
    ),
    "h100-12-05-tails": lambda: _tails(
        merged(tuple(n for n, _ in H100_HEADLINE))["summary"], lambda r: str(r["stage"])
    ),
    "h100-12-05-idle-split": lambda: _idle_split(
        (*H100_HEADLINE, *H100_FEEDBACK, *H100_FIT_SLICES)
    ),
    "h100-12-05b-m8-per-stage": lambda: _per_stage(result(H100_M8[0][0])["summary"], ("mix",)),
    "h100-12-05b-m8-idle-split": lambda: _idle_split(H100_M8),
    "h100-12-05b-zb": lambda: schedules((*H100_ZB, *H100_ZB_S3)),
    "h100-12-05b-zb-idle-split": lambda: _idle_split((*H100_ZB, *H100_ZB_S3)),
    "h100-12-05c-sizes": lambda: _idle_split(H100_SIZES),
    "h100-12-05d-latency": lambda: signal_latency(_pipeline_rows(H100_LATENCY)),
    "h100-12-05d-stages": lambda: _side_by_side(
        (*H100_SPIN_TREE, *H100_SIGNALS), ("managed", "governed")
    ),
    "h100-12-05d-idle-split": lambda: _idle_split(H100_SPIN_TREE),
    "h100-12-06-overhead": lambda: h200_overhead(_pipeline_rows((H100_M4_ALL, H100_M8_ALL))),
    "h100-12-06-harvest": lambda: h200_harvest(_pipeline_rows((H100_M4_ALL, H100_M8_ALL))),
    "h100-12-06-latency": lambda: signal_latency(_latency_12_06()),
    "h100-12-06-stages": lambda: _side_by_side(H100_12_06, ("managed", "governed")),
    "h100-12-06-idle-split": lambda: _idle_split(H100_12_06),
    "h100-12-06b-overhead": lambda: h200_overhead(_pipeline_rows((H100_B_M4_ALL, H100_B_M8_ALL))),
    "h100-12-06b-harvest": lambda: h200_harvest(_pipeline_rows((H100_B_M4_ALL, H100_B_M8_ALL))),
    "h100-12-06b-latency": lambda: signal_latency(_pipeline_rows(H100_12_06B)),
    "h100-12-06b-stages": lambda: _side_by_side(H100_12_06B, ("managed", "governed")),
    "h100-12-06b-idle-split": lambda: _idle_split(H100_12_06B),
    "h100-12-06b-slots": lambda: slots_against_the_guard(H100_SLOTS),
    "h100-12-06c-stages": lambda: _side_by_side(H100_12_06C, ("governed",)),
    "h100-12-06c-idle-split": lambda: _idle_split(H100_12_06C),
    "h100-12-06c-slots": lambda: slots_against_the_guard(H100_12_06C),
    "h100-12-06d-stages": lambda: _side_by_side(H100_12_06D, ("governed",)),
    "h100-12-06d-idle-split": lambda: _idle_split(H100_12_06D),
    "h100-12-06e-stages": lambda: _side_by_side(H100_12_06E, ("governed",)),
    "h100-12-06e-idle-split": lambda: _idle_split(H100_12_06E),
    "h100-12-06g-stages": lambda: _side_by_side(H100_12_06G, ("governed",)),
    "h100-12-06g-idle-split": lambda: _idle_split(H100_12_06G),
    "image-bands-h100": image_bands,
    "h100-12-07-stages": lambda: _side_by_side(H100_12_07, ("governed",)),
    "h100-12-07-idle-split": lambda: _idle_split(H100_12_07),
    "h100-12-07b-pipeline-overhead": lambda: h200_overhead(_pipeline_rows(H100_12_07B)),
    "h100-12-07b-pipeline-harvest": lambda: h200_harvest(_pipeline_rows(H100_12_07B)),
    "h100-12-07b-stages": lambda: _side_by_side(H100_12_07B, ("governed",)),
    "h100-12-07b-idle-split": lambda: _idle_split(H100_12_07B),
    "h100-12-07b-step-speed": lambda: step_speed(H100_12_07B_LEDGERS),
    "h100-12-07b-harvest-ceiling": lambda: harvest_ceiling(H100_12_07B_CEILINGS),
    "host-path-between-cpu": host_path_between,
    "host-path-h100-host": lambda: host_path_between(HOST_PATH_H100_HOST),
    "h100-12-07d-pipeline-overhead": lambda: h200_overhead(_labelled_rows(H100_12_07D)),
    "h100-12-07d-pipeline-harvest": lambda: h200_harvest(_labelled_rows(H100_12_07D)),
    "h100-12-07d-stages": lambda: _side_by_side(H100_12_07D, ("governed",)),
    "h100-12-07d-idle-split": lambda: _idle_split(H100_12_07D),
    "h100-12-07d-guards": lambda: guard_costs(H100_12_07D_LEDGERS),
    "h100-12-07d-harvest-ceiling": lambda: harvest_ceiling(H100_12_07D_CEILINGS[::2]),
    "h100-12-07e-pipeline-overhead": lambda: h200_overhead(_labelled_rows(H100_12_07E[4:])),
    "h100-12-07e-pipeline-harvest": lambda: h200_harvest(_labelled_rows(H100_12_07E[4:])),
    "h100-12-07e-stages": lambda: _side_by_side(H100_12_07E, ("governed",)),
    "h100-12-07e-idle-split": lambda: _idle_split(H100_12_07E),
    "h100-12-07e-guards": lambda: guard_costs(H100_12_07E_LEDGERS),
    "h100-12-07e-run-queue": lambda: run_queue_table(H100_12_07E_RUN_QUEUE),
    "h100-12-07e-host-path": lambda: host_path_between(
        HOST_PATH_H100_12_07E, "the H100 machine's CPU, idle"
    ),
    "h100-12-07e-latency": lambda: signal_latency(_labelled_rows(H100_12_07E)),
    "h100-12-07e-floats": lambda: bubble_floats_table(H100_12_07E_FLOATS),
    "image-bands-h100-12-07f": lambda: image_band_ways(IMAGE_BANDS_12_07F),
    "h100-12-07f-pipeline-overhead": lambda: h200_overhead(_labelled_rows(H100_12_07F[:2])),
    "h100-12-07f-pipeline-harvest": lambda: h200_harvest(_labelled_rows(H100_12_07F[:2])),
    "h100-12-07f-stages": lambda: _side_by_side(H100_12_07F, ("governed",)),
    "h100-12-07f-idle-split": lambda: _idle_split(H100_12_07F),
    "h100-12-07f-guards": lambda: guard_costs(H100_12_07F_LEDGERS),
    "h100-12-07f-step-speed": lambda: step_speed(H100_12_07F_LEDGERS),
    "h100-12-07f-latency": lambda: signal_latency(_labelled_rows(H100_12_07F)),
    "h100-12-07g-pipeline-overhead": lambda: h200_overhead(_labelled_rows(H100_12_07G[:2])),
    "h100-12-07g-pipeline-harvest": lambda: h200_harvest(_labelled_rows(H100_12_07G[:2])),
    "h100-12-07g-stages": lambda: _side_by_side(H100_12_07G, ("governed",)),
    "h100-12-07g-idle-split": lambda: _idle_split(H100_12_07G),
    "h100-12-07g-guards": lambda: guard_costs(H100_12_07G_LEDGERS),
    "h100-12-07g-step-speed": lambda: step_speed(H100_12_07G_LEDGERS),
    "h100-12-07g-latency": lambda: signal_latency(_labelled_rows(H100_12_07G)),
    "h100-12-07g-actions": lambda: action_times_table(
        (
            *H100_12_07G_ACTIONS,
            *_files_of(H100_12_07F[:2], ("zb-on", "zb-off"), "h100-2026-12-07f-actions"),
        )
    ),
    "host-path-cold-cpu": host_path_cold,
    "first-steps-h100": first_steps,
    "h100-12-07d-call-guard-replay": lambda: call_guard_replay(H100_CALL_GUARD),
    "h100-12-07c-zb": lambda: schedules(H100_12_07C[:2]),
    "h100-12-07c-pipeline-overhead": lambda: h200_overhead(_labelled_rows(H100_12_07C[:2])),
    "h100-12-07c-pipeline-harvest": lambda: h200_harvest(_labelled_rows(H100_12_07C[:2])),
    "h100-12-07c-stages": lambda: _side_by_side(H100_12_07C, ("governed",)),
    "h100-12-07c-idle-split": lambda: _idle_split(H100_12_07C),
    "h100-12-07c-harvest-ceiling": lambda: harvest_ceiling(H100_12_07C_CEILINGS),
    "h100-12-07c-step-gaps": lambda: step_gaps((*H100_12_07B_LEDGERS, *H100_12_07C_LEDGERS)),
    "state-copy-ahead-h100": lambda: pin_ahead_table(STATE_COPY_AHEAD),
    "state-copy-h100": state_copy,
    "host-stalls-h100": lambda: host_stalls(HOST_STALLS),
    "host-stalls-h100-12-08": lambda: host_stalls(HOST_STALLS_12_08),
    "h100-12-08-pipeline-overhead": lambda: h200_overhead(_labelled_rows(H100_M8_EVERY_STAGE)),
    "h100-12-08-pipeline-harvest": lambda: h200_harvest(_labelled_rows(H100_M8_EVERY_STAGE)),
    "h100-12-08-stages": lambda: _side_by_side(H100_M8_EVERY_STAGE, ("governed",)),
    "h100-12-08-idle-split": lambda: _idle_split(H100_12_08),
    "h100-12-08-guards": lambda: guard_costs(H100_12_08_LEDGERS),
    "h100-12-08-step-speed": lambda: step_speed(H100_12_08_LEDGERS),
    "state-copy-inflight-h100": state_copy_in_flight,
    "h100-12-08-harvest-ceiling": lambda: harvest_ceiling(H100_12_08_CEILINGS),
    "h200-12-06-placement": lambda: placement_policies(result(H200_PLACEMENT)),
    "h200-12-06-placement-cells": placement_cells_table,
    # once the placer knows the tasks' slices
    "h200-12-06-placement-sliced": lambda: placement_policies(_with_slices(H200_PLACEMENT)),
    "h200-goals-now": goals_now,
    "h200-levers-now": levers_now,
    "h200-12-04g-emulated-idle": emulated_idle,
    "h200-12-04g-zb-emulation": lambda: schedules(H200_ZB_EMULATION),
    "h200-12-04f-schedules": schedules,
    "h200-12-04f-graphed-steps": graphed_steps,
    "h200-12-04f-graphs": lambda: _side_by_side(H200_GRAPHS, ("managed", "governed")),
    "h200-12-04f-graphs-idle": lambda: _idle_split(H200_GRAPHS),
    "h200-12-04f-mps": lambda: _side_by_side(H200_MPS_GRAPHS, ("managed", "governed")),
    "h200-12-04f-inference": lambda: _side_by_side(H200_INFERENCE_TOKENS, GATED_MODES),
    "h200-12-04e-trickle": lambda: _side_by_side(H200_TRICKLE, ("governed", "trickle")),
    "h200-12-04e-inference": lambda: _side_by_side(H200_INFERENCE, GATED_MODES),
    "h200-12-04d-idle-split": lambda: _idle_split(H200_IDLE_SPLIT),
    "h200-12-04d-overhead": lambda: h200_overhead(_idle_split_rows()),
    "h200-12-04d-harvest": lambda: h200_harvest(_idle_split_rows()),
    "h200-12-04d-levers": lambda: _idle_split(H200_LEVERS),
    "h200-12-04b-overhead": lambda: h200_overhead(_instrument_rows()),
    "h200-12-04b-harvest": lambda: h200_harvest(_instrument_rows()),
    "h200-12-04b-per-stage": h200_instrument_per_stage,
    "h200-12-04b-goals": lambda: h200_goals([result(H200_INSTRUMENT)]),
    "h200-12-04b-old-vs-new": h200_instrument_old_vs_new,
    "timing-overhead-h200": timing_overhead,
    "timing-overhead-h200-quiet": timing_overhead_quiet,
    "edge-watcher-h200": edge_watcher,
    "h200-12-04c-overhead": lambda: h200_overhead(_merged_rows()),
    "h200-12-04c-harvest": lambda: h200_harvest(_merged_rows()),
    "h200-12-04c-per-stage": lambda: _per_stage(result(H200_MERGED)["summary"], ("mix",)),
    "h200-12-04c-tails": h200_merged_tails,
    "h200-12-04c-announce": h200_announce_ab,
    "h200-12-04-overhead": lambda: h200_overhead(_split_rows()),
    "h200-12-04-harvest": lambda: h200_harvest(_split_rows()),
    "h200-12-04-per-stage": h200_split_per_stage,
    "h200-12-04-goals": lambda: h200_goals([merged(H200_SPLIT)]),
    "h200-overhead": h200_overhead,
    "h200-harvest": h200_harvest,
    "h200-old-vs-new": h200_old_vs_new,
    "h200-goals": h200_goals,
    "h200-per-stage": h200_per_stage,
    "h200-dedicated": h200_dedicated,
    "h200-instrumentation": h200_instrumentation,
    "freeride-comparison": freeride_comparison,
    "cpu-2026-12-02": cpu_2026_12_02,
    "cpu-dry-run": cpu_dry_run,
    "cpu-pause": cpu_pause,
    "timing-overhead-cpu": timing_overhead_cpu,
    "fidelity-cpu": fidelity_cpu,
    "predictor-cpu": predictor_cpu,
    "predictor-peers-cpu": predictor_peers_cpu,
    "step-sizes-cpu": step_sizes_cpu,
    "outlived-replay": outlived_replay,
    "outlived-replay-zb-12-07f": lambda: outlived_replay(
        OUTLIVED_REPLAY_ZB, OUTLIVED_ZB_RUNS, OUTLIVED_MIX_TASKS
    ),
    "outlived-replay-m8-12-08": lambda: outlived_replay(
        OUTLIVED_REPLAY_M8, OUTLIVED_M8_RUNS, OUTLIVED_MIX_TASKS
    ),
    "boundary-cpu": boundary_cpu,
    "edge-latency-cpu": edge_latency_cpu,
    "host-path-cpu": host_path_cpu,
    "host-path-tail-cpu": host_path_tail_cpu,
}


# -- rewriting --------------------------------------------------------------------------------


def render(text: str) -> str:
    """``text`` with every marked table regenerated.

    Raises:
        ValueError: a marker names no known table, or a known table has no marker.
    """
    found = [m["name"] for m in _MARK.finditer(text)]
    unknown = sorted(set(found) - set(TABLES))
    if unknown:
        raise ValueError(
            f"BENCHMARKS.md marks unknown table(s) {unknown}; known: {', '.join(TABLES)}"
        )
    missing = sorted(set(TABLES) - set(found))
    if missing:
        raise ValueError(
            f"table(s) {missing} have no <!-- table:NAME --> ... <!-- /table:NAME --> region"
        )

    def fill(m: re.Match[str]) -> str:
        body = "\n".join(TABLES[m["name"]]())
        return f"<!-- table:{m['name']} -->\n{body}\n<!-- /table:{m['name']} -->"

    return _MARK.sub(fill, text)


def stale_regions(old: str, new: str) -> list[str]:
    """Names of the regions whose text differs between ``old`` and ``new``."""
    before = {m["name"]: m["body"] for m in _MARK.finditer(old)}
    after = {m["name"]: m["body"] for m in _MARK.finditer(new)}
    return sorted(n for n in after if before.get(n) != after[n])


def result_markdowns() -> dict[Path, str]:
    """The ``.md`` beside each committed bench result, as today's arithmetic writes it."""
    out = {}
    for name in bench_results():
        path = (RESULTS / name).with_suffix(".md")
        if path.exists():
            out[path] = markdown(result(name))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if anything is stale"
    )
    parser.add_argument("--doc", type=Path, default=DOC, help="the document (BENCHMARKS.md)")
    parser.add_argument("--no-results-md", action="store_true",
                        help="leave the .md files beside the results alone")  # fmt: skip
    args = parser.parse_args(argv)
    text = args.doc.read_text()
    try:
        new = render(text)
    except ValueError as exc:
        print(f"make_tables: {exc}", file=sys.stderr)
        return 2
    stale = [f"{args.doc.name}: table {n}" for n in stale_regions(text, new)]
    mds = {} if args.no_results_md else result_markdowns()
    stale += [str(p.relative_to(ROOT)) for p, md in mds.items() if p.read_text() != md]
    if args.check:
        if stale:
            print("stale (run python benchmarks/make_tables.py):", *stale, sep="\n  ")
            return 1
        return 0
    args.doc.write_text(new)
    for path, md in mds.items():
        path.write_text(md)
    print(
        f"rewrote {len(stale)} table(s)/file(s)" + (":\n  " + "\n  ".join(stale) if stale else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
