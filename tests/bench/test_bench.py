"""``freeride-lab bench`` end to end on the CPU: emulated peers, one tiny side task.

No speed is asserted (timings belong to benchmarks/); the test checks that one short run
produces every mode's blocks and the ratios computed from them.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from freeride_lab.bench.profiles import PROFILES, bench_profile
from freeride_lab.cli.app import UsageError, build_parser, main
from freeride_lab.cli.bench import bench_profile_of

MODES = {"vanilla", "managed", "governed", "naive"}


#: The tiny run takes about 35 s on a 2-core machine (five blocks per mode, two solo phases).
slow = pytest.mark.soak  # a tiny bench run: minutes of training in several modes


@pytest.fixture(scope="module")
def tiny_result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("bench")
    out = root / "tiny.json"
    code = main(
        [
            "bench", "--profile", "tiny", "--emulate-peers", "--device", "cpu",
            "--real-stage", "1", "--out", str(out), "--run-root", str(root / "runs"),
        ]
    )  # fmt: skip
    assert code == 0, (root / "runs").glob("*/logs/*")
    data: dict[str, object] = json.loads(out.read_text())
    data["_out"] = str(out)
    return data


@slow
def test_tiny_bench_records_blocks_of_every_mode(tiny_result: dict[str, object]) -> None:
    blocks = tiny_result["blocks"]
    assert isinstance(blocks, list)
    modes = {b["mode"] for b in blocks if b["case"] == "pagerank"}
    assert modes == MODES
    assert all(len(b["step_ms"]) == b["steps"] == 2 for b in blocks)


@slow
def test_tiny_bench_interleaves_modes_in_repeats_closed_by_vanilla(
    tiny_result: dict[str, object],
) -> None:
    blocks = [b for b in tiny_result["blocks"] if b["case"] == "pagerank"]  # type: ignore[union-attr]
    order = [b["mode"] for b in sorted(blocks, key=lambda b: b["order"])]
    assert order == ["vanilla", "managed", "governed", "naive"] * 5 + ["vanilla"]


@slow
def test_tiny_bench_computes_ratios_against_vanilla(tiny_result: dict[str, object]) -> None:
    rows = [r for r in tiny_result["summary"] if r["case"] == "pagerank"]  # type: ignore[union-attr]
    by_mode = {r["mode"]: r for r in rows}
    assert set(by_mode) == MODES
    assert by_mode["vanilla"]["ratio_vs_vanilla"] == 1.0
    for mode in ("managed", "governed", "naive"):
        ratio = by_mode[mode]["ratio_vs_vanilla"]
        assert ratio is not None and math.isfinite(ratio) and ratio > 0
        assert by_mode[mode]["overhead_frac"] == pytest.approx(ratio - 1.0)


@slow
def test_tiny_bench_measures_the_side_tasks_dedicated_speed_and_harvest(
    tiny_result: dict[str, object],
) -> None:
    (speed,) = tiny_result["dedicated"]  # type: ignore[misc]
    assert speed["before_per_s"] > 0 and speed["after_per_s"] > 0
    assert speed["dedicated_per_s"] == pytest.approx(
        (speed["before_per_s"] + speed["after_per_s"]) / 2
    )
    assert speed["spread_frac"] is not None and isinstance(speed["unstable"], bool)
    naive = next(
        r
        for r in tiny_result["summary"]  # type: ignore[union-attr]
        if r["case"] == "pagerank" and r["mode"] == "naive"
    )
    assert naive["progress"] > 0 and naive["harvest_frac"] is not None


@slow
def test_tiny_bench_reports_cost_both_ways_per_mode(tiny_result: dict[str, object]) -> None:
    rows = {r["mode"]: r for r in tiny_result["pipeline"]}  # type: ignore[union-attr]
    assert set(rows) == MODES - {"vanilla"}
    naive = rows["naive"]
    assert naive["saving_corrected_frac"] == pytest.approx(
        naive["saving_published_frac"] - naive["overhead_all_stages_estimate_frac"]
    )


@slow
def test_tiny_bench_records_its_command_versions_and_calibration(
    tiny_result: dict[str, object],
) -> None:
    assert "bench" in str(tiny_result["command"])
    assert tiny_result["versions"]["torch"]  # type: ignore[index]
    run = tiny_result["runs"][0]  # type: ignore[index]
    assert [c["rank"] for c in run["calibration"]] == [0, 1]
    assert run["errors"] == []


@slow
def test_tiny_bench_times_the_task_alone_before_and_after_its_blocks_for_2_s_and_20_steps(
    tiny_result: dict[str, object],
) -> None:
    (segment,) = [s for s in tiny_result["runs"][0]["segments"] if s["task"]]  # type: ignore[index]
    for phase in ("", "_after"):
        assert segment[f"solo{phase}_s"] >= 2.0
        assert segment[f"solo{phase}_steps"] >= 20


@slow
def test_tiny_bench_counts_a_tasks_overruns_as_its_host_logged_them(
    tiny_result: dict[str, object],
) -> None:
    run = tiny_result["runs"][0]  # type: ignore[index]
    (segment,) = [s for s in run["segments"] if s["task"]]
    log = (Path(run["run_dir"]) / "logs" / f"task-{segment['task_id']}.log").read_text()
    found = re.search(rf"task {segment['task_id']}: (\d+) of (\d+) steps overran", log)
    assert found, log[-2000:]
    assert (segment["task_overruns_total"], segment["task_steps_total"]) == (
        int(found[1]),
        int(found[2]),
    )
    blocks = [b for b in tiny_result["blocks"] if b["case"] == "pagerank"]  # type: ignore[union-attr]
    assert sum(b["overruns"] for b in blocks) <= segment["task_overruns_total"]


@pytest.mark.parametrize("name", PROFILES)
def test_every_profile_measures_five_blocks_per_mode_and_long_solo_phases(name: str) -> None:
    profile = bench_profile(name, "cpu")
    assert profile.repeats >= 5 and profile.instrumentation_repeats >= 5
    assert profile.solo_min_s >= 2.0 and profile.solo_steps >= 20


@slow
def test_tiny_bench_writes_a_markdown_table_beside_the_json(
    tiny_result: dict[str, object],
) -> None:
    md = Path(str(tiny_result["_out"])).with_suffix(".md").read_text()
    assert "| m4 | pagerank | naive |" in md


def test_bench_refuses_to_run_without_emulated_peers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--profile", "tiny"]) == 2
    assert "--emulate-peers" in capsys.readouterr().err


def test_bench_names_the_valid_profiles_for_an_unknown_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "--profile", "huge", "--emulate-peers", "--device", "cpu"]) == 2
    assert "'huge'" in capsys.readouterr().err and all(p in PROFILES for p in ("quick", "tiny"))


@pytest.mark.parametrize(
    ("flag", "value"),
    [("announce-min-ms", "-1"), ("announce-min-ms", "nan"), ("step-group-ms", "-1"),
     ("step-group-ms", "1e9")],
)  # fmt: skip
def test_a_bad_runtime_option_is_a_usage_error_before_anything_runs(
    flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    argv = ["bench", "--profile", "tiny", "--emulate-peers", "--device", "cpu",
            f"--{flag}", value, "--out", str(out)]  # fmt: skip
    assert main(argv) == 2
    assert flag.replace("-", "_") in capsys.readouterr().err
    assert not out.exists()


def test_quick_gpu_profile_runs_freerides_mix_at_m4_first() -> None:
    profile = bench_profile("quick", "cuda")
    first = profile.runs[0]
    assert (first.microbatches, first.cases, first.instrumentation) == (4, ("mix",), True)
    assert profile.stages == 4 and profile.dtype == "bfloat16"


def bench_options(*words: str) -> object:
    args = build_parser().parse_args(["bench", "--emulate-peers", *words])
    return bench_profile_of(args, "cuda")


def test_real_stage_all_rotates_through_every_stage_even_in_runs_that_name_one() -> None:
    default = bench_options("--runs", "m4-mps")
    assert [r.real_stages for r in default.runs] == [(1,)]
    everything = bench_options("--runs", "m4-mps,m8-timeslice", "--real-stage", "all")
    assert [r.real_stages for r in everything.runs] == [None, None]  # None: every stage
    some = bench_options("--real-stage", "0,3", "--repeats", "3")
    assert {r.real_stages for r in some.runs} == {(0, 3)} and some.repeats == 3


def test_task_options_from_the_command_line_merge_over_the_profiles() -> None:
    profile = bench_options("--task-options", '{"resnet18": {"micro_batches": 4}}')
    assert profile.task_options["resnet18"]["micro_batches"] == 4  # type: ignore[attr-defined]
    cpu = bench_profile_of(
        build_parser().parse_args(
            ["bench", "--emulate-peers", "--task-options", '{"pagerank": {"seed": 3}}']
        ),
        "cpu",
    )
    assert cpu.task_options["pagerank"]["seed"] == 3
    assert len(cpu.task_options["pagerank"]) > 1  # the profile's own options stay


def test_gpu_runs_step_the_vision_tasks_in_graphed_slices_unless_told_otherwise() -> None:
    gpu = bench_profile("quick", "cuda").task_options
    assert gpu["resnet18"] == {"cuda_graphs": True, "micro_batches": 2}
    assert gpu["vgg19"] == {"cuda_graphs": True, "micro_batches": 4}
    whole = bench_options("--task-options", '{"vgg19": {"cuda_graphs": false, "micro_batches": 1}}')
    assert whole.task_options["vgg19"] == {"cuda_graphs": False, "micro_batches": 1}
    assert whole.task_options["resnet18"]["micro_batches"] == 2


def test_gpu_runs_graph_the_image_tasks_bands_with_any_band_options() -> None:
    """The image task's band steps are graphed by default on a GPU, and options given for its
    bands keep that (merged), including one band an image, where the option does nothing."""
    from freeride_lab.tasks.image import ImageTask

    assert bench_profile("quick", "cuda").task_options["image"] == {"cuda_graphs": True}
    for given in ('{"image": {"bands": 128, "step_bands": 8}}', '{"image": {"bands": 1}}'):
        options = bench_options("--task-options", given).task_options["image"]
        assert options["cuda_graphs"] is True
        ImageTask(preset="gpu", **options)  # a valid task, not an error at its first bubble


@pytest.mark.parametrize(
    ("option", "text"),
    [
        *(
            ("--task-options", t)
            for t in ("{", '["resnet18"]', '{"resnet18": 4}', '{"resnt18": {}}')
        ),
        *(("--modes", t) for t in ("governed,vanilla", "vanilla,trickel", "vanilla,vanilla")),
        ("--schedule", "Interleaved"),
        ("--chunks", "0"),
    ],
)
def test_bad_task_options_or_modes_are_a_usage_error_before_anything_runs(
    option: str, text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    argv = ["bench", "--profile", "tiny", "--emulate-peers", "--device", "cpu",
            option, text, "--out", str(out)]  # fmt: skip
    assert main(argv) == 2
    assert option in capsys.readouterr().err
    assert not out.exists()


def test_a_schedule_and_its_chunks_reach_every_runs_config(tmp_path: Path) -> None:
    from freeride_lab.bench.profiles import run_config

    profile = bench_options("--schedule", "Interleaved1F1B", "--chunks", "2")
    configs = [run_config(profile, plan, tmp_path) for plan in profile.runs]  # type: ignore[attr-defined]
    assert {(c.schedule, c.chunks) for c in configs} == {("Interleaved1F1B", 2)}


@pytest.mark.parametrize(
    ("words", "predictor"),
    [((), "min"), (("--predictor", "feedback"), "feedback"), (("--predictor", "peers"), "peers")],
)
def test_the_bubble_predictor_reaches_every_runs_ranks(
    tmp_path: Path, words: tuple[str, ...], predictor: str
) -> None:
    from freeride_lab.bench.profiles import run_config

    profile = bench_options(*words)
    configs = [run_config(profile, plan, tmp_path) for plan in profile.runs]  # type: ignore[attr-defined]
    assert {c.runtime.predictor for c in configs} == {predictor}


@pytest.mark.parametrize(
    ("words", "outlived"),
    [
        ((), "stop"),
        (("--outlived", "survivors"), "survivors"),
        (("--outlived", "hand-on"), "hand-on"),
    ],
)
def test_what_a_host_does_past_a_predicted_end_reaches_every_run(
    tmp_path: Path, words: tuple[str, ...], outlived: str
) -> None:
    from freeride_lab.bench.profiles import run_config

    profile = bench_options(*words)
    configs = [run_config(profile, plan, tmp_path) for plan in profile.runs]  # type: ignore[attr-defined]
    assert {c.runtime.outlived for c in configs} == {outlived}


@pytest.mark.parametrize(("words", "leftovers"), [((), ""), (("--leftovers", "image"), "image")])
def test_a_task_beside_every_segments_task_takes_its_leftovers_when_named(
    words: tuple[str, ...], leftovers: str
) -> None:
    from freeride_lab.bench.profiles import run_segments

    profile = bench_options(*words)
    plan = profile.runs[0]  # type: ignore[attr-defined]
    segments = run_segments(profile, plan)  # type: ignore[arg-type]
    assert segments and {s.leftovers for s in segments if s.task != "image"} == {leftovers}


def test_a_segment_whose_task_is_the_leftovers_task_gets_none_beside_it() -> None:
    """A task beside itself would only find what its own steps and guard leave: nothing."""
    from freeride_lab.bench.profiles import run_segments

    profile = bench_options("--leftovers", "image", "--real-stage", "all")
    plan = profile.runs[0]  # type: ignore[attr-defined]
    beside = {s.task: s.leftovers for s in run_segments(profile, plan)}  # type: ignore[arg-type]
    assert beside == {"pagerank": "image", "resnet18": "image", "image": "", "vgg19": "image"}


def test_a_parked_tasks_smallest_step_fits_no_bubble_the_open_gate_included() -> None:
    """While the task beside it is timed alone, the segment's task is parked under a guard no
    bubble holds; a task with step sizes guards its smallest step with a share of it."""
    from freeride_lab.bench import blocks
    from freeride_lab.core.budget import sized_budget_ns
    from freeride_lab.pipeline import emulate_control

    guard_ns = sized_budget_ns(int(blocks._PARKED_MS * 1e6), 1, 64, None, None)
    assert guard_ns > emulate_control._OPEN_FOR_NS


@pytest.mark.parametrize(("words", "on"), [((), True), (("--governor-signals", "off"), False)])
def test_the_governors_device_signals_can_be_switched_off_for_an_a_b(
    words: tuple[str, ...], on: bool
) -> None:
    assert bench_options(*words).governor_device_signals is on  # type: ignore[attr-defined]


@pytest.mark.parametrize(("words", "evidence"), [((), 0.95), (("--governor-evidence", "0.5"), 0.5)])
def test_the_governors_evidence_can_be_set_for_an_a_b(
    words: tuple[str, ...], evidence: float
) -> None:
    assert bench_options(*words).governor_evidence == evidence  # type: ignore[attr-defined]


def test_a_governor_evidence_below_a_coin_toss_is_refused_before_any_run() -> None:
    with pytest.raises(ValueError, match=r"governor_evidence=0\.3 must be in \[0\.5, 1\)"):
        bench_options("--governor-evidence", "0.3")


@pytest.mark.parametrize(
    ("words", "guard"),
    [
        ((), (1.1, 0.5)),
        (("--governed-guard", "1.0,0"), (1.0, 0.0)),
        (("--governed-guard", "1.2"), (1.2, 0.0)),
    ],
)
def test_the_governed_guard_can_be_set_for_an_a_b(
    words: tuple[str, ...], guard: tuple[float, float]
) -> None:
    profile = bench_options(*words)
    assert (profile.governed_guard_factor, profile.governed_guard_slack_ms) == guard  # type: ignore[attr-defined]


@pytest.mark.parametrize("given", ["0.9,0.5", "1.1,-1", "wide"])
def test_a_guard_that_would_overrun_or_does_not_parse_is_refused_before_any_run(given: str) -> None:
    with pytest.raises((ValueError, UsageError), match=r"factor|slack|FACTOR"):
        bench_options("--governed-guard", given)


def test_peer_costs_come_from_a_results_calibration_and_reach_the_emulation(
    tmp_path: Path,
) -> None:
    from freeride_lab.bench.profiles import run_config

    calibration = [{"rank": r, "device": "cuda:0", "forward_ms": [17.0 + r], "backward_ms": [36.0],
                    "weight_ms": [0.0], "optimizer_ms": 14.0} for r in (3, 1, 0, 2)]  # fmt: skip
    result = tmp_path / "before.json"
    runs = [{"name": "m4", "calibration": []}, {"name": "m8", "calibration": calibration}]
    result.write_text(json.dumps({"runs": runs}))
    profile = bench_options("--peer-costs", str(result))
    costs = profile.peer_costs  # type: ignore[attr-defined]
    assert [(c.rank, c.forward_ms) for c in costs] == [(r, (17.0 + r,)) for r in range(4)]
    config = run_config(profile, profile.runs[0], tmp_path / "run")  # type: ignore[attr-defined]
    assert config.runtime.emulate is not None and config.runtime.emulate.costs == costs


@pytest.mark.parametrize(
    "content", ["not json", '{"runs": []}', '{"runs": [{"calibration": [{"rank": 0}]}]}']
)
def test_peer_costs_from_a_file_without_a_calibration_are_refused_in_one_line(
    tmp_path: Path, content: str
) -> None:
    result = tmp_path / "r.json"
    result.write_text(content)
    with pytest.raises(UsageError, match=r"--peer-costs .*r\.json: not a bench result"):
        bench_options("--peer-costs", str(result))


def test_peer_costs_for_another_number_of_stages_are_refused(tmp_path: Path) -> None:
    calibration = [{"rank": 0, "forward_ms": [1.0], "backward_ms": [2.0], "weight_ms": [0.0],
                    "optimizer_ms": 1.0}]  # fmt: skip
    result = tmp_path / "r.json"
    result.write_text(json.dumps({"runs": [{"calibration": calibration}]}))
    with pytest.raises(ValueError, match="peer_costs for 1 ranks; the profile has 4 stages"):
        bench_options("--peer-costs", str(result))


def test_modes_from_the_command_line_replace_every_runs_modes() -> None:
    profile = bench_options("--modes", "vanilla,governed,trickle")
    assert {r.modes for r in profile.runs} == {("vanilla", "governed", "trickle")}


@slow
def test_tiny_bench_times_how_long_side_tasks_start_steps_after_their_bubbles_end(
    tiny_result: dict[str, object],
) -> None:
    rows = {r["mode"]: r for r in tiny_result["pipeline"]}  # type: ignore[union-attr]
    blocks: list[dict[str, object]] = tiny_result["blocks"]  # type: ignore[assignment]
    timed = 0
    for mode in ("managed", "governed"):  # a mode whose task used no bubble has no figure
        used = [x for b in blocks if b["mode"] == mode for x in b["pause_ms"]]  # type: ignore[attr-defined]
        pause = rows[mode]["pause_p99_ms"]
        assert (pause is not None and pause >= 0.0) if used else pause is None, rows[mode]
        timed += len(used)
    assert timed > 0  # the task used bubbles in at least one gated mode
    assert rows["naive"]["pause_p99_ms"] is None  # naive co-location runs through everything
    for mode in ("managed", "governed"):  # the first hop of the signal latency, where timed
        wake, whole = rows[mode]["wake_p50_ms"], rows[mode]["latency_p50_ms"]
        assert wake is None or 0.0 <= wake <= whole, rows[mode]
        # the hop before the edge: on the CPU a rank announces at the stamp itself
        lag = rows[mode]["announce_p99_ms"]
        assert lag is None or 0.0 <= lag < 1.0, rows[mode]


@pytest.mark.slow
def test_each_segment_measures_with_its_own_task_alone_attached(tmp_path: Path) -> None:
    """One stage at a time means one side task at a time: a segment attaches its task when it
    begins (its set-up timed) and detaches it when it ends, so no other stage's task sits
    parked on the device through its blocks, nor any task through the instrumentation's."""
    out = tmp_path / "two.json"
    code = main(
        [
            "bench", "--profile", "tiny", "--emulate-peers", "--device", "cpu",
            "--real-stage", "0,1", "--modes", "vanilla,managed",
            "--out", str(out), "--run-root", str(tmp_path / "runs"),
        ]
    )  # fmt: skip
    assert code == 0
    (run,) = json.loads(out.read_text())["runs"]
    segments = {(s["case"], s["stage"]): s for s in run["segments"]}
    assert set(segments) == {("instrumentation", 0), ("pagerank", 0), ("pagerank", 1)}
    assert segments["instrumentation", 0]["attached_tasks"] == 0
    for stage in (0, 1):
        seg = segments["pagerank", stage]
        assert seg["attached_tasks"] == 1
        assert 0 < seg["setup_s"] < seg["elapsed_s"]


@pytest.mark.slow
def test_a_segment_with_a_leftovers_task_measures_both_alone_and_their_steps_never_meet(
    tmp_path: Path,
) -> None:
    """ResNet-18's CPU step fits none of the tiny run's bubbles: PageRank, beside it with
    gating "leftovers", is handed them whole. Both are timed alone (ResNet-18 with PageRank
    attached and idle; PageRank with ResNet-18 parked), and the stage's harvest is theirs."""
    from runs import read_events

    from freeride_lab.core import events as ev

    out = tmp_path / "leftovers.json"
    code = main(
        [
            "bench", "--profile", "tiny", "--emulate-peers", "--device", "cpu",
            "--real-stage", "1", "--modes", "vanilla,governed", "--cases", "resnet18",
            "--leftovers", "pagerank", "--out", str(out), "--run-root", str(tmp_path / "runs"),
        ]
    )  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    (run,) = result["runs"]
    (seg,) = [s for s in run["segments"] if s["task"] == "resnet18"]
    beside = seg["leftovers"]
    assert beside["task"] == "pagerank" and beside["dedicated_before_per_s"] > 0
    assert beside["dedicated_after_per_s"] > 0
    (row,) = [r for r in result["summary"] if r["mode"] == "governed"]
    assert (row["task"], row["leftovers_task"]) == ("resnet18", "pagerank")
    assert row["leftovers_progress"] > 0
    rest_share = row["leftovers_harvest_of_measured_idle_frac"] * row["vanilla_idle_frac"]
    assert row["harvest_frac"] >= rest_share * (1 - 1e-9)  # both tasks' work, PageRank's in it
    events = Path(run["run_dir"]) / "events"
    spans = {}
    for task_id in (seg["task_id"], beside["task_id"]):
        steps = read_events(events / f"task-{task_id}.jsonl")
        spans[task_id] = [(e.start_ns, e.end_ns) for e in steps if isinstance(e, ev.SideTaskStep)]
    main_steps, rest_steps = spans[seg["task_id"]], spans[beside["task_id"]]
    assert rest_steps
    assert not [(a, b) for a in main_steps for b in rest_steps if a[0] < b[1] and b[0] < a[1]]
