"""``freeride-lab bench --resume``: a result cut short is continued, measuring only what it lacks.

The unit tests build results by hand; the slow test cuts a real tiny CPU bench after its first
segment and continues it in a second call.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from freeride_lab.bench import resume
from freeride_lab.bench.blocks import RunDriver
from freeride_lab.bench.profiles import PROFILES, RunPlan, bench_profile, run_segments
from freeride_lab.bench.results import jsonable, machine, versions
from freeride_lab.cli.app import main


def _block(run: str, case: str, stage: int, mode: str = "vanilla") -> dict[str, Any]:
    return {"run": run, "case": case, "stage": stage, "task": case, "mode": mode}


def _result(**changes: Any) -> dict[str, Any]:
    """A quick-profile result whose first call finished stage 0, left stage 1 half done and
    skipped the rest (segments as ``bench.blocks`` records them)."""
    profile = bench_profile("quick", "cuda")
    result: dict[str, Any] = {
        "benchmark": "bench",
        "config": jsonable(dataclasses.asdict(profile)),
        "versions": {"freeride_lab_source": "abc", "torch": "2.11", "gpu": "NVIDIA H200"},
        "machine": {"power_limit_w": 700.0},
        "interrupted": True,
        "runs": [
            {
                "name": "m4-timeslice",
                "segments": [
                    {"case": "instrumentation", "stage": 0, "task": ""},
                    {"case": "mix", "stage": 0, "task": "pagerank", "elapsed_s": 80.0},
                    {"case": "mix", "stage": 1, "task": "resnet18"},  # cut in its blocks
                ],
                "skipped": ["mix@2 (image): ~90 s, 10 s left"],
                "skipped_need_s": [90.0],
            },
            {"name": "m4-mps", "skipped": "time budget (12 s)"},
        ],
        "blocks": [
            _block("m4-timeslice", "instrumentation", 0),
            _block("m4-timeslice", "mix", 0),
            _block("m4-timeslice", "mix", 0, "managed"),
            _block("m4-timeslice", "mix", 1),
        ],
    }
    result.update(changes)
    return result


def test_the_budget_to_finish_a_result_is_named_where_its_skips_were_estimated() -> None:
    profile = resume.profile_of(_result())
    assert resume.budget_to_finish_s(profile, _result()) is None  # a run skipped whole
    (timesliced, _) = _result()["runs"]
    timesliced["startup_s"] = 55.0
    assert resume.budget_to_finish_s(profile, {"runs": [timesliced]}) is None  # a cut segment
    timesliced["segments"] = timesliced["segments"][:2]
    # its start-up, the skipped segment's 90 s and 20 s, rounded up to 10 s
    assert resume.budget_to_finish_s(profile, {"runs": [timesliced]}) == 170
    interrupted = {"runs": [timesliced], "interrupted": True}
    assert resume.budget_to_finish_s(profile, interrupted) is None


def test_only_segments_that_finished_count_as_measured() -> None:
    done = resume.completed(_result())
    assert done == {"m4-timeslice": frozenset({("instrumentation", 0), ("mix", 0)})}


def test_a_continuation_drops_what_the_cut_left_half_done() -> None:
    kept = resume.without_partial(_result())
    assert {(b["case"], b["stage"]) for b in kept["blocks"]} == {("instrumentation", 0), ("mix", 0)}
    (run,) = kept["runs"]  # the run the budget skipped whole is decided again
    assert [s["stage"] for s in run["segments"]] == [0, 0]
    assert run["skipped"] == [] and run["skipped_need_s"] == [] and "interrupted" not in kept


def test_a_continuation_measures_the_segments_left_and_no_instrumentation_twice() -> None:
    profile = resume.profile_of(_result())
    first = profile.runs[0]
    done = resume.completed(_result())["m4-timeslice"]
    left = [(s.case, s.stage, s.task) for s in run_segments(profile, first, done)]
    assert left == [("mix", 1, "resnet18"), ("mix", 2, "image"), ("mix", 3, "vgg19")]
    from freeride_lab.bench.profiles import instrumentation_stage

    assert instrumentation_stage(profile, first, done) is None
    assert instrumentation_stage(profile, first) == 0


def test_what_a_result_has_not_measured_is_named_segment_by_segment() -> None:
    result = _result()
    profile = resume.profile_of(result)
    left = resume.left_to_measure(profile, result)
    assert left[:3] == ["m4-timeslice: mix@1 (resnet18)", "m4-timeslice: mix@2 (image)",
                        "m4-timeslice: mix@3 (vgg19)"]  # fmt: skip
    assert any(x.startswith("m4-mps: ") for x in left)  # the run skipped whole
    assert "m4-timeslice: mix@0 (pagerank)" not in left
    assert not any("instrumentation" in x for x in left if x.startswith("m4-timeslice"))


@pytest.mark.parametrize(("need", "budget"), [([49.0], "110"), (None, "SECONDS")])
def test_a_call_that_leaves_segments_unmeasured_says_which_and_how_to_continue(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    need: list[float] | None,
    budget: str,
) -> None:
    # a budget too short for the one segment asked for: the call measures only the
    # instrumentation blocks, and must not read as if it had measured the task; it names the
    # budget that would finish it (its start-up, 40 s, the segment's 49 s and 20 s, to 10 s),
    # where the skipped segment's estimate was kept
    from freeride_lab.bench import driver

    def short_budget(profile: Any, **_: Any) -> dict[str, Any]:
        plan = profile.runs[0]
        run = {"name": plan.name, "startup_s": 40.0,
               "segments": [{"case": "instrumentation", "stage": 3, "task": ""}],
               "skipped": ["mix@3 (vgg19): ~49 s, 40 s left"]}  # fmt: skip
        if need is not None:
            run["skipped_need_s"] = need
        return {"config": jsonable(dataclasses.asdict(profile)), "runs": [run],
                "blocks": [_block(plan.name, "instrumentation", 3)]}  # fmt: skip

    monkeypatch.setattr(driver, "run_bench", short_budget)
    monkeypatch.setattr("freeride_lab.bench.markdown.markdown", lambda result: "")
    out = tmp_path / "r.json"
    argv = ["bench", "--emulate-peers", "--quick", "--device", "cpu", "--runs", "m4-timeslice",
            "--real-stage", "3", "--time-budget-s", "110", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "not measured (1): m4-timeslice: mix@3 (vgg19)" in err
    assert f"--resume {out} --time-budget-s {budget}`" in err


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("name", PROFILES)
def test_the_profile_a_result_was_started_with_is_rebuilt_exactly(name: str, device: str) -> None:
    profile = bench_profile(name, device)
    profile = profile.replace(
        runs=(*profile.runs, RunPlan(name="x", microbatches=8, real_stages=(2, 0),
                                     modes=("vanilla", "trickle"))),
    )  # fmt: skip
    config = json.loads(json.dumps(jsonable(dataclasses.asdict(profile))))
    assert resume.profile_of({"config": config}) == profile


def test_a_profile_whose_peers_replay_costs_is_rebuilt_exactly() -> None:
    from freeride_lab.core.runtime_options import ReplayCosts

    costs = tuple(
        ReplayCosts(rank=r, forward_ms=(17.5 + r,), backward_ms=(36.0,), weight_ms=(0.0,),
                    optimizer_ms=14.0)
        for r in range(4)
    )  # fmt: skip
    profile = bench_profile("quick", "cuda").replace(peer_costs=costs)
    config = json.loads(json.dumps(jsonable(dataclasses.asdict(profile))))
    assert resume.profile_of({"config": config}) == profile


def test_a_profile_field_this_version_does_not_know_is_refused() -> None:
    config = _result()["config"]
    with pytest.raises(ValueError, match=r"\['warp_factor'\].*start a new result"):
        resume.profile_of({"config": {**config, "warp_factor": 9}})


def test_a_result_measured_by_other_code_or_on_another_gpu_is_not_continued() -> None:
    result = _result()
    same = {"freeride_lab_source": "abc", "torch": "2.11", "gpu": "NVIDIA H200"}
    resume.check_same_setup(result, same, {"power_limit_w": 700.0})  # no error
    with pytest.raises(resume.OtherSetup) as err:
        resume.check_same_setup(
            result, {**same, "freeride_lab_source": "def"}, {"power_limit_w": 600.0}
        )
    message = str(err.value)
    assert "versions.freeride_lab_source: 'abc' then, 'def' now" in message
    assert "machine.power_limit_w: 700.0 then, 600.0 now" in message
    assert "versions.torch" not in message


@pytest.mark.parametrize(
    ("text", "match"),
    [(None, "no such file"), ("{", "cannot read it as JSON"),
     ('{"benchmark": "timing"}', "not a `freeride-lab bench` result"),
     ('{"benchmark": "bench", "config": {}, "runs": {}, "blocks": []}', "'runs' is not a list"),
     ('{"benchmark": "bench", "config": {}, "runs": [3], "blocks": []}', r"runs\[0\] is not"),
     ('{"benchmark": "bench", "config": {}, "runs": [], "blocks": [{"run": "m4"}]}',
      r"blocks\[0\] is not an object with run, case, stage")],
)  # fmt: skip
def test_a_missing_or_damaged_result_is_one_clear_error(
    tmp_path: Path, text: str | None, match: str
) -> None:
    path = tmp_path / "r.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ValueError, match=match):
        resume.load_result(path)


def test_resume_refuses_options_that_would_change_the_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_result()))
    argv = ["bench", "--emulate-peers", "--resume", str(path), "--real-stage", "2", "--quick"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "drop --profile, --real-stage" in err
    assert main(["bench", "--emulate-peers", "--resume", str(path), "--device", "cpu"]) == 2
    assert "was measured on cuda" in capsys.readouterr().err
    assert json.loads(path.read_text()) == _result()  # untouched


def test_every_bench_option_either_shapes_the_profile_or_only_the_call() -> None:
    """A new option must say which: one that shapes the profile is refused with --resume."""
    from freeride_lab.cli.app import build_parser
    from freeride_lab.cli.bench import _PROFILE_OPTIONS

    call = {"emulate_peers", "device", "out", "run_root", "resume", "time_budget_s"}
    everywhere = {"command", "handler", "log_level"}  # every subcommand's
    bench = set(vars(build_parser().parse_args(["bench", "--emulate-peers"])))
    assert bench - everywhere - call == set(_PROFILE_OPTIONS)


def test_resume_elsewhere_is_a_usage_error_and_leaves_the_result_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = _result()
    result["config"] = jsonable(dataclasses.asdict(bench_profile("tiny", "cpu")))
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))  # measured by source 'abc' on an H200
    assert main(["bench", "--emulate-peers", "--resume", str(path)]) == 2
    assert "cannot continue this result here" in capsys.readouterr().err
    assert json.loads(path.read_text()) == result


def test_a_result_with_nothing_left_to_measure_is_kept_and_the_call_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = bench_profile("tiny", "cpu")
    result = _result(
        config=jsonable(dataclasses.asdict(profile)),
        versions=versions(),
        machine=machine(),
        runs=[{"name": "m4", "microbatches": 4, "segments": [
            {"case": "instrumentation", "stage": 0, "task": ""},
            {"case": "pagerank", "stage": 0, "task": "pagerank", "elapsed_s": 40.0},
            {"case": "pagerank", "stage": 1, "task": "pagerank", "elapsed_s": 40.0},
        ], "skipped": []}],
        blocks=[],
    )  # fmt: skip
    result.pop("interrupted")
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    assert main(["bench", "--emulate-peers", "--resume", str(path)]) == 1  # no blocks at all
    err = capsys.readouterr().err
    assert "every segment measured by an earlier call" in err and "not measured" not in err
    again = json.loads(path.read_text())
    assert again["runs"] == result["runs"]
    (call,) = again["resumed"]
    assert "--resume" in call["command"] and call["elapsed_s"] >= 0


class _SteppingSession:
    """A session whose four ranks have run ``n`` steps ``gap_ms`` apart (the first gap 3 s)."""

    def __init__(self, n: int, gap_ms: float) -> None:
        rows = [(rank, 5_000.0 + s * gap_ms + (0 if s else -3_000.0))
                for s in range(n) for rank in range(4)]  # fmt: skip
        self.steps = pd.DataFrame(rows, columns=["rank", "start_ms"])
        self.steps_done = n


def test_a_continuation_estimates_its_first_segment_from_the_runs_own_steps(
    tmp_path: Path,
) -> None:
    """A continuation whose instrumentation is measured starts with a task segment: its
    estimate comes from the run's step time, not a placeholder that makes a 0.42 s step's
    segment look 2.4 times as long and skips it though it fits the time budget."""
    profile = bench_profile("quick", "cuda")
    plan = profile.runs[0]
    done = frozenset({("instrumentation", 1)})
    driver = RunDriver(profile, plan, tmp_path, deadline=0.0, say=lambda _: None, done=done)
    driver.session = _SteppingSession(n=8, gap_ms=420.0)
    driver._time_steps()
    assert driver.step_ms_estimate == pytest.approx(420.0)
    blocks = len(plan.modes or profile.modes) * profile.repeats + 1
    steps = blocks * (profile.drop_steps + profile.block_steps + 2)
    # the steps at 0.42 s, the solo phases and the task's set-up (a first guess of 30 s until
    # a segment has timed one)
    assert driver._segment_estimate_s() < steps * 0.42 + driver.setup_s_estimate + 30.0


@pytest.mark.slow
def test_a_bench_cut_after_its_first_segment_is_finished_by_a_second_call(
    tmp_path: Path,
) -> None:
    """The first call measures stage 1 of a plan covering stages 1 and 0 and is cut there (as
    its time budget would); ``--resume`` measures stage 0 only, into the same file."""
    out = tmp_path / "tiny.json"
    runs = tmp_path / "runs"
    argv = ["bench", "--profile", "tiny", "--emulate-peers", "--device", "cpu",
            "--modes", "vanilla,managed", "--real-stage", "1",
            "--out", str(out), "--run-root", str(runs)]  # fmt: skip
    assert main(argv) == 0
    first = json.loads(out.read_text())
    cut = copy.deepcopy(first)
    cut["config"]["runs"][0]["real_stages"] = [1, 0]  # the plan the cut call had
    cut["runs"][0]["skipped"] = ["pagerank@0 (pagerank): ~40 s, 3 s left"]
    out.write_text(json.dumps(cut))

    resumed = ["bench", "--emulate-peers", "--resume", str(out), "--run-root", str(runs)]
    assert main(resumed) == 0
    data = json.loads(out.read_text())
    trees = [r for r in data["runs"] if r["name"] == "m4"]
    assert len(trees) == 2  # one process tree per call
    assert [s["stage"] for s in trees[1]["segments"]] == [0]  # stage 1 not measured again
    assert {s["case"] for s in trees[1]["segments"]} == {"pagerank"}  # nor instrumentation
    assert trees[0]["skipped"] == []  # decided again by the continuation
    assert [b for b in data["blocks"] if b["stage"] == 1] == first["blocks"]
    assert {b["stage"] for b in data["blocks"] if b["case"] == "pagerank"} == {0, 1}
    (managed,) = [r for r in data["pipeline"] if r["mode"] == "managed"]
    assert managed["stages_covered"] == 2  # both calls' blocks in one table
    assert data["date"] == first["date"] and len(data["resumed"]) == 1
    md = out.with_suffix(".md").read_text()
    assert f"continued {data['resumed'][0]['date']}" in md  # the result says it took two calls
