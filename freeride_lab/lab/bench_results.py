"""The results of ``freeride-lab bench``: blocks from a run's events, the tables, JSON and
markdown. ``lab/bench.py`` drives the runs; ``core/benchstats.py`` holds the arithmetic.

    rows = [block_row(b, "m4", starts, bubbles, side, edges, samples, t0) for b in blocks]
    fill_tables(result, stages=4)          # summary, pipeline, dedicated speeds, headline
    write_results(result, Path("results/h200.json"))   # and results/h200.md

The results file holds: benchmark, profile, command, date, versions (python, torch, CUDA,
driver, GPU), machine, config (the profile), cost_model, goals, runs (per run: its settings,
calibration, segments with each task's solo speed and budget, skipped parts, errors, governor
decisions), blocks (``core.benchstats.BLOCK_COLUMNS`` plus the raw ``step_ms``), summary
(``SUMMARY_COLUMNS``), pipeline (``PIPELINE_COLUMNS``), dedicated_per_s and headline.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from freeride_lab.core import benchstats as bs
from freeride_lab.core.accounting import CostModel

__all__ = [
    "block_row",
    "cost_model_dict",
    "default_out",
    "fill_tables",
    "jsonable",
    "machine",
    "markdown",
    "versions",
    "write_results",
]


def fill_tables(result: dict[str, Any], *, stages: int) -> None:
    """Fill the summary tables from the blocks collected so far."""
    blocks = pd.DataFrame(result["blocks"], columns=[*bs.BLOCK_COLUMNS, "step_ms"])
    if blocks.empty:
        result.update(summary=[], pipeline=[], dedicated_per_s={}, headline={})
        return
    blocks["latency_ms"] = [tuple(x) for x in blocks["latency_ms"]]
    dedicated: dict[str, list[float]] = {}
    for run in result["runs"]:
        for seg in run.get("segments", []):
            v = seg.get("dedicated_per_s")
            if seg.get("task") and v is not None and math.isfinite(v):
                dedicated.setdefault(seg["task"], []).append(v)
    dedicated_per_s = {k: bs.median(v) for k, v in dedicated.items()}
    m_of_run = {r["name"]: r["microbatches"] for r in result["runs"] if "microbatches" in r}
    summary = bs.summarize_blocks(
        blocks, stages=stages, microbatches=m_of_run, dedicated_per_s=dedicated_per_s
    )
    from freeride_lab.tasks import REFERENCE_KEYS

    pipeline = bs.pipeline_summary(summary, blocks, stages=stages, reference_keys=REFERENCE_KEYS)
    result["dedicated_per_s"] = dedicated_per_s
    result["summary"] = _records(summary)
    result["pipeline"] = _records(pipeline)
    result["headline"] = _headline(summary, pipeline)


def _headline(summary: pd.DataFrame, pipeline: pd.DataFrame) -> dict[str, Any]:
    """The numbers the issue's goals are about, per run (mix case) and instrumentation."""
    out: dict[str, Any] = {}
    for _, row in pipeline[pipeline["case"] == "mix"].iterrows():
        out.setdefault(str(row["run"]), {})[str(row["mode"])] = {
            "overhead_mean_frac": row["overhead_mean_frac"],
            "overhead_worst_frac": row["overhead_max_frac"],
            "harvest_frac": row["harvest_frac"],
            "harvest_of_limit_frac": row["harvest_of_limit_frac"],
            "saving_published_frac": row["saving_published_frac"],
            "saving_corrected_frac": row["saving_corrected_frac"],
            "latency_p50_ms": row["latency_p50_ms"],
            "latency_p99_ms": row["latency_p99_ms"],
        }
    plain = summary[(summary["case"] == "instrumentation") & (summary["mode"] == "plain")]
    for _, row in plain.iterrows():
        ratio = float(row["ratio_vs_vanilla"])  # plain / timed
        out.setdefault(str(row["run"]), {})["instrumentation_overhead_frac"] = (
            1.0 / ratio - 1.0 if ratio > 0 else math.nan
        )
    headline: dict[str, Any] = jsonable(out)
    return headline


def block_row(
    b: Mapping[str, Any],
    run: str,
    starts: Mapping[tuple[int, int], int],
    bubbles: pd.DataFrame,
    side: pd.DataFrame,
    edges: Sequence[Mapping[str, Any]],
    samples: Sequence[Any],
    t0: int,
) -> dict[str, Any] | None:
    """One ``BLOCK_COLUMNS`` row (plus the raw ``step_ms``), or None if steps are missing."""
    r, first, k = int(b["stage"]), int(b["first_step"]), int(b["steps"])
    ns = [starts.get((r, s)) for s in range(first, first + k + 1)]
    if any(x is None for x in ns):
        return None
    ns_ok = [int(x) for x in ns if x is not None]
    periods = bs.step_periods_ms(ns_ok)
    lo_ms, hi_ms = (ns_ok[0] - t0) / 1e6, (ns_ok[-1] - t0) / 1e6
    mine = bubbles[(bubbles["rank"] == r) & bubbles["step"].between(first, first + k - 1)]
    gaps = list(zip(mine["start_ms"], mine["end_ms"], strict=True))
    s = side[(side["stage"] == r) & (side["start_ms"] >= lo_ms) & (side["start_ms"] < hi_ms)]
    if b.get("task_id"):
        s = s[s["task_id"] == b["task_id"]]
    busy = [(a, min(e, hi_ms)) for a, e in zip(s["start_ms"], s["end_ms"], strict=True)]
    latency: list[float] = []
    if b["mode"] in ("managed", "governed") and len(s):
        lo_ns, hi_ns = ns_ok[0], ns_ok[-1]
        mine_edges = [e for e in edges if int(e["rank"]) == r and lo_ns <= e["t_ns"] < hi_ns]
        open_: dict[tuple[int, int], int] = {}
        pairs: list[tuple[int, int]] = []
        for e in sorted(mine_edges, key=lambda e: e["t_ns"]):
            key = (int(e["step"]), int(e["slot"]))
            if e["edge"] == "start":
                open_[key] = int(e["t_ns"])
            elif key in open_:
                pairs.append((open_.pop(key), int(e["t_ns"])))
        step_ns = [round(x * 1e6) + t0 for x in s["start_ms"]]
        latency = bs.signal_latency_ms([p[0] for p in pairs], [p[1] for p in pairs], step_ns)
    lo_ns, hi_ns = ns_ok[0], ns_ok[-1]
    window = [x for x in samples if lo_ns <= x.t_ns < hi_ns]
    return {
        "run": run,
        "case": b["case"],
        "stage": r,
        "task": b["task"],
        "mode": b["mode"],
        "repeat": int(b["repeat"]),
        "order": int(b["order"]),
        "first_step": first,
        "steps": k,
        "step_ms_median": bs.median(periods),
        "wall_s": (ns_ok[-1] - ns_ok[0]) / 1e9,
        "bubble_ms": float(mine["duration_ms"].sum()),
        "progress": float(s["progress"].sum()),
        "unit": str(s["unit"].iloc[0]) if len(s) else "",
        "side_steps": len(s),
        "busy_ms": float(sum(e - a for a, e in busy if e > a)),
        "busy_in_bubble_ms": bs.overlap_ms(gaps, busy),
        "overruns": int((s["overrun_ms"] > 0).sum()),
        "overrun_ms_total": float(s["overrun_ms"].clip(lower=0).sum()),
        "latency_ms": latency,
        "sm_clock_mhz": bs.median(x.sm_clock_mhz for x in window),
        "power_w": bs.median(x.power_w for x in window),
        "step_ms": [round(x, 4) for x in periods],
    }


# -- output -----------------------------------------------------------------------------------


def versions() -> dict[str, Any]:
    import importlib.metadata

    import torch

    from freeride_lab.runtime import nvml

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "unknown"

    gpu = None
    if nvml.is_available() and nvml.device_count() > 0:
        handle = nvml.query("nvmlDeviceGetHandleByIndex", 0, default=None)
        name = None if handle is None else nvml.query("nvmlDeviceGetName", handle, default=None)
        gpu = name.decode() if isinstance(name, bytes) else name
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "freeride_lab": version("freeride-lab"),
        "driver": nvml.driver_version(),
        "gpu": gpu,
        "nvml": nvml.unavailable_reason() or "ok",
    }


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2),
        "host": platform.node(),
    }


def cost_model_dict(model: CostModel) -> dict[str, Any]:
    return {
        "reference_throughput_per_s": dict(model.reference_throughput_per_s),
        "reference_gpu": model.reference_gpu,
        "c_ref_usd_per_h": model.c_ref_usd_per_h,
        "c_srv_usd_per_h": model.c_srv_usd_per_h,
        "price_ratio": model.price_ratio,
    }


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [jsonable(r) for r in frame.to_dict(orient="records")]


def jsonable(value: Any) -> Any:
    """Plain JSON: NaN and infinities become None, tuples lists, numpy scalars Python ones."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_results(result: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(jsonable(result), indent=1) + "\n")
    os.replace(tmp, out)
    out.with_suffix(".md").write_text(markdown(result))


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and not math.isfinite(v))


def _pct(v: Any, digits: int = 2) -> str:
    return "-" if _missing(v) else f"{100 * float(v):.{digits}f}%"


def _num(v: Any, fmt: str = ".3g") -> str:
    return "-" if _missing(v) else format(float(v), fmt)


def markdown(result: Mapping[str, Any]) -> str:
    """The results as markdown tables: pipeline rows, per-stage rows, calibration."""
    v = result.get("versions", {})
    lines = [
        f"# freeride-lab bench ({result.get('profile')}) — {result.get('date')}",
        "",
        f"`{result.get('command')}`",
        "",
        f"GPU {v.get('gpu')}, driver {v.get('driver')}, torch {v.get('torch')} "
        f"(CUDA {v.get('cuda')}), python {v.get('python')}; "
        f"{result.get('machine', {}).get('cpu_count')} CPUs; elapsed {result.get('elapsed_s')} s",
        "",
        "## Pipeline (per run, case and mode; overheads vs interleaved vanilla blocks)",
        "",
        "| run | case | mode | stages | overhead mean | worst | sum | harvest | of limit | "
        "saving published | corrected | latency p50/p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.get("pipeline", []):
        lines.append(
            f"| {r['run']} | {r['case']} | {r['mode']} | {r['stages_covered']} | "
            f"{_pct(r['overhead_mean_frac'])} | {_pct(r['overhead_max_frac'])} | "
            f"{_pct(r['overhead_sum_frac'])} | {_pct(r['harvest_frac'], 1)} | "
            f"{_pct(r['harvest_of_limit_frac'], 0)} | {_pct(r['saving_published_frac'])} | "
            f"{_pct(r['saving_corrected_frac'])} | {_num(r['latency_p50_ms'])}/"
            f"{_num(r['latency_p99_ms'])} |"
        )
    lines += [
        "",
        "## Per stage",
        "",
        "| run | case | stage | task | mode | blocks | step ms | overhead (min..max) | "
        "throughput | bubble used | harvest | idle | overruns | SM MHz | W |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.get("summary", []):
        lines.append(
            f"| {r['run']} | {r['case']} | {r['stage']} | {r['task'] or '-'} | {r['mode']} | "
            f"{r['blocks']} | {_num(r['step_ms_median'], '.1f')} | {_pct(r['overhead_frac'])} "
            f"({_pct(r['overhead_min_frac'])}..{_pct(r['overhead_max_frac'])}) | "
            f"{_num(r['throughput_per_s'])} {r['unit']}/s | {_pct(r['bubble_used_frac'], 0)} | "
            f"{_pct(r['harvest_frac'], 1)} | {_pct(r['idle_frac'], 0)} | {r['overruns']} | "
            f"{_num(r['sm_clock_mhz'], '.0f')} | {_num(r['power_w'], '.0f')} |"
        )
    lines += ["", "## Runs", ""]
    for run in result.get("runs", []):
        if "skipped" in run and isinstance(run["skipped"], str):
            lines.append(f"- {run['name']}: skipped ({run['skipped']})")
            continue
        cal = "; ".join(
            f"rank {c['rank']}: F {c['forward_ms']} B {c['backward_ms']} opt {c['optimizer_ms']}"
            for c in run.get("calibration", [])
        )
        lines.append(
            f"- {run['name']} (M={run.get('microbatches')}, MPS {run.get('mps')}): state "
            f"{run.get('state')}, start-up {run.get('startup_s')} s; calibration (ms) {cal}"
        )
        memory = ", ".join(
            f"rank {m['rank']} {m['peak_reserved_bytes'] / 2**30:.1f} GiB"
            for m in run.get("stage_memory", [])
        )
        if memory:
            lines.append(f"  - peak reserved memory: {memory}")
        for note in [*run.get("skipped", []), *run.get("errors", [])]:
            lines.append(f"  - {note}")
    ded = result.get("dedicated_per_s", {})
    if ded:
        lines += ["", "Dedicated speed alone on the device (units/s): "
                  + ", ".join(f"{k} {_num(x)}" for k, x in ded.items())]  # fmt: skip
    return "\n".join(lines) + "\n"


def default_out(device: str, gpu_name: str = "") -> Path:
    """``benchmarks/results/<gpu-or-cpu>-<date>.json`` under the working directory.

    ``gpu_name`` is the device's name ("NVIDIA H200"): its model ("h200") names the file, so
    numbers from different GPUs never share one.
    """
    kind = "cpu" if device != "cuda" else gpu_model(gpu_name)
    return Path("benchmarks") / "results" / f"{kind}-{datetime.now().date().isoformat()}.json"


def gpu_model(name: str) -> str:
    """A short file-name form of a GPU's name: "NVIDIA H100 80GB HBM3" → "h100"; "gpu" if none."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w and w != "nvidia"]
    return words[0] if words else "gpu"
