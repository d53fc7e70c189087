"""Configs are checked before anything starts: every value a run cannot use is refused by
``RunConfig`` (or ``simulate``) with one line, before a process exists.

Each case below was accepted once and failed only after the launch (or printed a table of
``inf``); the property test draws whole configs and requires that each is refused with one
``ValueError``/``TypeError`` line or is well-formed (finite, in range, JSON round-trip).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from freeride_lab.cli.app import main
from freeride_lab.core.config import MAX_COST_MS, RunConfig, RuntimeOptions


def _costs(rank: int, **changes: Any) -> dict[str, Any]:
    """One rank's calibration report, as a bench result records it."""
    return {"rank": rank, "forward_ms": [20.0], "backward_ms": [36.0], "weight_ms": [0.0],
            "optimizer_ms": 14.0, **changes}  # fmt: skip


REFUSED = [
    ({"seed": 10**30}, "seed"),
    ({"seed": -(2**70)}, "seed"),
    ({"t_forward_ms": 1e300}, "t_forward_ms"),
    ({"t_backward_weight_ms": MAX_COST_MS * 2}, "t_backward_weight_ms"),
    ({"master_addr": ""}, "master_addr"),
    ({"bus_host": "  "}, "bus_host"),
    ({"text_path": "/no/such/corpus.txt"}, "text_path"),
    ({"text_path": ""}, "text_path"),
    ({"microbatches": 10**12}, "microbatches"),
    ({"steps": 10**12}, "steps"),
    ({"seq_len": 1 << 30}, "seq_len"),
    ({"runtime": {"stop_grace_s": "soon"}}, "stop_grace_s"),
    ({"runtime": {"stop_grace_s": math.inf}}, "stop_grace_s"),
    ({"runtime": {"pg_timeout_s": -1}}, "pg_timeout_s"),
    ({"runtime": {"timed": "sometimes"}}, "timed"),
    ({"runtime": {"alternate_every": 0}}, "alternate_every"),
    ({"runtime": {"announce_min_ms": -1}}, "announce_min_ms"),
    ({"runtime": {"announce_min_ms": math.nan}}, "announce_min_ms"),
    ({"runtime": {"step_group_ms": -1}}, "step_group_ms"),
    ({"runtime": {"step_group_ms": math.nan}}, "step_group_ms"),
    ({"runtime": {"step_group_ms": 1e9}}, "step_group_ms"),
    ({"runtime": {"step_group_ms": True}}, "step_group_ms"),
    ({"runtime": {"predictor": "oracle"}}, "predictor"),
    ({"runtime": {"outlived": "forever"}}, "outlived"),
    ({"runtime": {"edges_factory": "not a reference"}}, "edges_factory"),
    ({"runtime": {"emulate": [1, 2]}}, "emulate"),
    ({"runtime": {"emulate": {"device": "tpu"}}}, "device"),
    ({"runtime": {"emulate": {"device": "cpu", "costs": [{"rank": 0}]}}}, "optimizer_ms"),
    (
        {"runtime": {"emulate": {"device": "cpu", "costs": [_costs(0, forward_ms=[-1.0])]}}},
        "forward_ms",
    ),
    (
        {"runtime": {"emulate": {"device": "cpu", "costs": [_costs(0, weight_ms=[99.0])]}}},
        "weight_ms",
    ),
    (
        {"runtime": {"emulate": {"device": "cpu", "costs": [_costs(0, optimizer_ms=math.nan)]}}},
        "optimizer_ms",
    ),
    ({"runtime": {"emulate": {"device": "cpu", "costs": [_costs(1)]}}}, "costs for ranks [1]"),
    (
        {"stages": 2, "runtime": {"emulate": {"device": "cpu", "costs": [_costs(0)]}}},
        "costs for 1 ranks; this run has 2",
    ),
    ({"runtime": {"note": 1}}, "note"),
    ({"runtime": [1]}, "runtime"),
    ({"notes": {"note": math.nan}}, "note"),
    ({"notes": {"note": object()}}, "note"),
    ({"notes": {"stop_grace_s": 5}}, "stop_grace_s"),
    ({"extra": {"stop_grace_s": 5}}, "extra"),
]


@pytest.mark.parametrize(("fields", "named"), REFUSED, ids=[n for _, n in REFUSED])
def test_a_value_a_run_cannot_use_is_refused_in_one_line_naming_it(
    fields: dict[str, Any], named: str
) -> None:
    with pytest.raises((ValueError, TypeError)) as info:
        RunConfig(**fields)
    message = str(info.value)
    assert named in message and "\n" not in message


def test_runtime_options_and_user_notes_survive_run_json() -> None:
    runtime = RuntimeOptions(stop_grace_s=5, timed="alternate")
    notes = {"who": "<b>me</b>", "n": [1]}
    config = RunConfig(runtime=runtime, notes=notes)
    again = RunConfig.from_dict(json.loads(config.to_json()))
    assert again.runtime == runtime and again.notes == notes


def test_replayed_emulation_costs_survive_run_json() -> None:
    runtime = RuntimeOptions(emulate={"device": "cpu", "costs": [_costs(0), _costs(1)]})
    config = RunConfig(stages=2, workload="text", runtime=runtime)
    again = RunConfig.from_dict(json.loads(config.to_json()))
    assert again.runtime == runtime
    assert again.runtime.emulate is not None and again.runtime.emulate.costs[1].forward_ms == (
        20.0,
    )


def test_an_older_run_json_with_extra_opens_with_its_runtime_keys_and_notes_split() -> None:
    saved = RunConfig().to_dict()
    del saved["runtime"], saved["notes"]
    saved["extra"] = {"stop_grace_s": 5, "emulate": {}, "note": {"who": "me"}}
    config = RunConfig.from_dict(saved)
    assert config.runtime == RuntimeOptions(stop_grace_s=5)
    assert config.notes == {"note": {"who": "me"}}


def test_an_old_run_whose_text_file_moved_still_opens(tmp_path: Any) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello " * 1000)
    saved = RunConfig(text_path=str(corpus)).to_dict()
    corpus.unlink()
    assert RunConfig.from_dict(saved, check_plan=False).text_path == str(corpus)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    "argv",
    [
        ["--t-forward-ms", "1e308"],
        ["--t-forward-ms", "inf"],
        ["--t-backward-input-ms", "nan"],
        ["--comm-ms", "1e400"],
        ["--dispatch-ms", "-1"],
        ["--microbatches", str(10**12)],
        ["--stages", "0"],
    ],
)
def test_simulate_refuses_non_finite_or_overflowing_input_in_one_line(argv: list[str]) -> None:
    code, out, err = run_cli(["simulate", "--stages", "2", "--microbatches", "4", *argv])
    assert code == 2, (out, err)
    assert err.startswith("freeride-lab: error: ") and err.count("\n") == 1, err
    assert "inf" not in out and "nan" not in out.lower()


NASTY: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 70),
    st.sampled_from([2**31, 2**63, 2**64, 10**12, 10**30, -(2**63), -(2**64)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1e-9, 1e300, 3.6e6, 3.7e6]),
    st.text(max_size=4),
    st.sampled_from(["", " ", "1F1B", "gpipe", "synthetic", "cpu", "cuda", "gloo"]),
    st.sampled_from([[1], {"a": 1}, {"stop_grace_s": math.nan}, {"timed": "x"}, {"emulate": {}}]),
)
FIELDS = ("schedule", "stages", "microbatches", "chunks", "steps", "workload", "t_forward_ms",
          "t_backward_input_ms", "t_backward_weight_ms", "layers", "d_model", "heads", "seq_len",
          "microbatch_size", "lr", "seed", "master_addr", "bus_host", "master_port", "text_path",
          "runtime", "notes", "extra")  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(FIELDS), NASTY, max_size=4))
@example(fields={"lr": 2**64})  # an int learning rate beyond 64 bits must leave run.json a float
def test_a_random_config_is_refused_in_one_line_or_well_formed(fields: dict[str, Any]) -> None:
    try:
        config = RunConfig(**fields, check_plan=False)
    except (ValueError, TypeError) as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    data = json.loads(config.to_json())  # what run.json holds
    for name, value in data.items():
        if isinstance(value, float):
            assert math.isfinite(value), name
        if isinstance(value, int) and not isinstance(value, bool):
            assert -(2**63) <= value < 2**64, name
    assert 0 <= config.t_forward_ms <= MAX_COST_MS
    assert config.master_addr.strip() and config.bus_host.strip()
    assert RunConfig.from_dict(data, check_plan=False) == config
