"""Continue a benchmark across calls: what a result has measured, and the profile it was run with.

A GPU benchmark rarely fits one call of a time-limited machine. ``freeride-lab bench --resume
RESULT`` reads a result that a call cut short (its time budget, a Ctrl-C, a failed run) and
measures only what it lacks, into the same file:

- ``profile_of(result)`` rebuilds the ``BenchProfile`` the result was started with, so the
  continuation measures under the same plan;
- ``check_same_setup(result, versions, machine)`` refuses to mix code or hardware: blocks
  measured by other sources, another torch or another GPU would be pooled into one interval;
- ``completed(result)`` is, per run, the segments that finished (a segment's record gets its
  ``elapsed_s`` only at its end; instrumentation is recorded once its blocks are in);
- ``left_to_measure(profile, result)`` is what the profile plans and the result lacks (what a
  continuation would measure);
- ``without_partial(result)`` drops what a cut left half done (the blocks and record of a
  segment that did not finish, and the notes of what was skipped), which the continuation then
  measures whole.

Blocks of one run measured in two process trees sit side by side: every figure pairs blocks
within one segment (run, case, stage, task), and a segment is measured in one tree only.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from freeride_lab.bench.profiles import (
    BenchProfile,
    RunPlan,
    instrumentation_stage,
    run_segments,
)

__all__ = [
    "SAME_SETUP_KEYS",
    "OtherSetup",
    "budget_to_finish_s",
    "check_same_setup",
    "completed",
    "left_to_measure",
    "load_result",
    "profile_of",
    "without_partial",
]

#: What must match between the call that started a result and the one that continues it:
#: (section, key) of the result's ``versions`` and ``machine``.
SAME_SETUP_KEYS: tuple[tuple[str, str], ...] = (
    ("versions", "freeride_lab_source"),
    ("versions", "torch"),
    ("versions", "cuda"),
    ("versions", "driver"),
    ("versions", "gpu"),
    ("machine", "power_limit_w"),
)
_INSTRUMENTATION = "instrumentation"


class OtherSetup(ValueError):
    """A result cannot be continued here: other code or hardware measured it."""


def load_result(path: Path) -> dict[str, Any]:
    """The benchmark result at ``path``, to continue.

    Raises:
        ValueError: it is missing, not JSON, or not a ``freeride-lab bench`` result.
    """
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(
            f"--resume {path}: no such file; give the JSON a bench call wrote"
        ) from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"--resume {path}: cannot read it as JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("benchmark") != "bench":
        raise ValueError(
            f"--resume {path}: not a `freeride-lab bench` result (its 'benchmark' field is "
            f"{data.get('benchmark') if isinstance(data, dict) else None!r}, not 'bench')"
        )
    for key, kind in (("config", dict), ("runs", list), ("blocks", list)):
        if not isinstance(data.get(key), kind):
            raise ValueError(f"--resume {path}: its {key!r} is not a {kind.__name__}; damaged?")
    for key, needs in (("runs", ("name",)), ("blocks", ("run", "case", "stage"))):
        for i, entry in enumerate(data[key]):
            if not isinstance(entry, dict) or any(k not in entry for k in needs):
                raise ValueError(
                    f"--resume {path}: {key}[{i}] is not an object with {', '.join(needs)}; "
                    "damaged?"
                )
    return data


def profile_of(result: Mapping[str, Any]) -> BenchProfile:
    """The ``BenchProfile`` a result was started with (its ``config``).

    Raises:
        ValueError: the config has fields this version's profile does not know, or values it
            refuses (the message names them).
    """
    config = dict(result["config"])
    known = {f.name for f in dataclasses.fields(BenchProfile)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise ValueError(
            f"the result's profile has field(s) {unknown} this version does not know: it was "
            "written by other code; start a new result instead"
        )
    plan_fields = {f.name for f in dataclasses.fields(RunPlan)}
    runs = []
    for run in config.pop("runs", []):
        extra = sorted(set(run) - plan_fields)
        if extra:
            raise ValueError(f"run {run.get('name')!r} has unknown field(s) {extra}")
        runs.append(RunPlan(**{k: _tuple(v) for k, v in run.items()}))
    config = {k: (v if k == "task_options" else _tuple(v)) for k, v in config.items()}
    return BenchProfile(runs=tuple(runs), **config)


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def check_same_setup(
    result: Mapping[str, Any], versions: Mapping[str, Any], machine: Mapping[str, Any]
) -> None:
    """Refuse to continue ``result`` with other code or hardware than it was started with.

    Raises:
        OtherSetup: naming every key of ``SAME_SETUP_KEYS`` that differs, with both values.
    """
    now = {"versions": versions, "machine": machine}
    differ = []
    for section, key in SAME_SETUP_KEYS:
        then = (result.get(section) or {}).get(key)
        if then != now[section].get(key):
            differ.append(f"{section}.{key}: {then!r} then, {now[section].get(key)!r} now")
    if differ:
        raise OtherSetup(
            "cannot continue this result here: blocks measured under another setup would be "
            "pooled into the same intervals (" + "; ".join(differ) + "). Start a new result "
            "(without --resume), or continue it on the code and machine that started it."
        )


def completed(result: Mapping[str, Any]) -> dict[str, frozenset[tuple[str, int]]]:
    """Per run name, the (case, stage) segments that finished, over all its process trees;
    instrumentation counts as the case ``"instrumentation"``."""
    done: dict[str, set[tuple[str, int]]] = {}
    for run in result.get("runs", []):
        if not isinstance(run, Mapping) or isinstance(run.get("skipped"), str):
            continue  # a run the budget skipped whole
        for seg in run.get("segments", []):
            if _finished(seg):
                done.setdefault(str(run["name"]), set()).add((str(seg["case"]), int(seg["stage"])))
    return {name: frozenset(segs) for name, segs in done.items()}


def left_to_measure(profile: BenchProfile, result: Mapping[str, Any]) -> list[str]:
    """What ``profile`` plans that ``result`` has not measured, one "run: case@stage (task)"
    per segment (the run's instrumentation as "run: instrumentation@stage"); empty when done."""
    done = completed(result)
    out = []
    for plan in profile.runs:
        mine = done.get(plan.name, frozenset())
        stage = instrumentation_stage(profile, plan, mine)
        if stage is not None:
            out.append(f"{plan.name}: {_INSTRUMENTATION}@{stage}")
        out += [f"{plan.name}: {s.case}@{s.stage} ({s.task})"
                for s in run_segments(profile, plan, mine)]  # fmt: skip
    return out


def budget_to_finish_s(profile: BenchProfile, result: Mapping[str, Any]) -> int | None:
    """The ``--time-budget-s`` a continuing call would need for what ``result``'s calls
    skipped for time: per run, its start-up (as measured, else the profile's estimate) and
    the estimates of the segments it skipped, plus 20 s; rounded up to 10 s. None where that
    is not known: a call cut short (a segment cut in its blocks, an interrupt), a run the
    budget skipped whole, or a result recorded before the estimates were kept.

        >>> from freeride_lab.bench.profiles import bench_profile
        >>> p = bench_profile("quick", "cuda")
        >>> budget_to_finish_s(p, {"runs": [{"startup_s": 40.0, "skipped": ["mix@3 ..."],
        ...                                  "skipped_need_s": [49.0]}]})
        110
        >>> budget_to_finish_s(p, {"runs": [{"skipped": "time budget (12 s)"}]}) is None
        True
    """
    if result.get("interrupted"):
        return None
    total = 0.0
    for run in result.get("runs", []):
        if not isinstance(run, Mapping):
            continue
        if any(isinstance(seg, Mapping) and not _finished(seg) for seg in run.get("segments", [])):
            return None  # a segment cut in its blocks: measured again whole, not estimated
        skipped = run.get("skipped")
        if isinstance(skipped, str):
            return None  # the whole run: its segments were never estimated
        need = run.get("skipped_need_s")
        if not skipped:
            continue
        if not isinstance(need, list) or len(need) != len(skipped):
            return None
        startup = run.get("startup_s")
        if not isinstance(startup, int | float):
            startup = profile.startup_estimate_s
        total += float(startup) + sum(float(x) for x in need) + 20.0
    return int(math.ceil(total / 10.0) * 10) if total else None


def _finished(seg: Mapping[str, Any]) -> bool:
    if seg.get("case") == _INSTRUMENTATION:
        return True  # recorded only after its last block
    return bool(seg.get("task")) and "elapsed_s" in seg


def without_partial(result: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``result`` holding only finished segments: the blocks and records of segments
    that did not finish are dropped, runs the budget skipped whole are dropped, and the notes
    of what was skipped are cleared (the continuation decides those again)."""
    out = copy.deepcopy(dict(result))
    done = completed(out)
    runs = []
    for run in out["runs"]:
        if isinstance(run.get("skipped"), str):
            continue
        run["segments"] = [s for s in run.get("segments", []) if _finished(s)]
        run["skipped"] = []
        if "skipped_need_s" in run:  # kept with the notes since they were
            run["skipped_need_s"] = []
        runs.append(run)
    out["runs"] = runs
    out["blocks"] = [
        b
        for b in out["blocks"]
        if (str(b["case"]), int(b["stage"])) in done.get(str(b["run"]), frozenset())
    ]
    out.pop("interrupted", None)
    return out
