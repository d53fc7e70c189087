"""BENCHMARKS.md's tables of results measured on the CPU (``make_tables`` registers them).

Each builder takes the committed results as loaded JSON and returns the table's lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from freeride_lab.bench.markdown import fmt_interval, fmt_pct, md_table


def timing_overhead(results: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """``bench_timing_overhead.py`` on the CPU: one row per (result file, case)."""
    rows = []
    for name, data in results:
        rc = data["recorder_ns_per_action"]
        for case in data["cases"]:
            o, u = case["overhead_frac"], case["overhead_us_per_action"]
            rows.append(
                [name, case["case"],
                 f"{case['median_step_ms']['timed']:.1f} / {case['median_step_ms']['plain']:.1f}",
                 fmt_interval(o["value"], o["lo"], o["hi"], 2, signed=True),
                 fmt_interval(u["value"], u["lo"], u["hi"], 1, pct=False),
                 str(case["block_pairs"]),
                 " / ".join(f"{rc[k]['median'] / 1e3:.1f}"
                            for k in ("no_edges", "edges_and_predictor", "edges_quiet_slots"))]
            )  # fmt: skip
    return md_table(
        ["result (CPU)", "case", "step ms timed / plain (median)", "overhead [95%]",
         "µs per action [95%]", "block pairs", "recorder µs: no edges / edges / quiet"],
        rows,
    )  # fmt: skip


def fidelity(data: dict[str, Any]) -> list[str]:
    """``bench_fidelity.py``: per schedule and action length, the ranks' measured idle beside
    theory, and what each action cost the run beyond its sleep."""
    rows = []
    for r in data["results"]:
        ranks = r["per_rank"]
        shape = f"{r['schedule']} {r['stages']}-{r['microbatches']}-{r['chunks']}"
        per_action = [x["overhead_ms_per_action"] for x in ranks]
        rows.append(
            [shape, f"{r['action_ms']:g}", fmt_pct(r["theory_frac"], 1),
             " / ".join(fmt_pct(x["measured_frac"], 1) for x in ranks),
             f"{max(x['points_above_theory'] for x in ranks):+.1f}",
             " / ".join(f"{x['schedule_ms_per_step']:.0f}" for x in ranks),
             " / ".join(f"{x['peer_ms_per_step'] + x['host_ms_per_step']:.0f}" for x in ranks),
             f"{min(per_action):.2f} to {max(per_action):.2f}"]
        )  # fmt: skip
    return md_table(
        ["schedule S-M-V (CPU)", "action ms", "theory", "measured idle per rank",
         "worst rank, points above theory", "schedule idle ms/step per rank",
         "peer + host ms/step per rank", "peer + host ms per action"],
        rows,
    )  # fmt: skip
