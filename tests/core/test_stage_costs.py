"""Per-stage synthetic costs: ``t_*_ms`` as one number for every stage or one value per stage
chunk, checked once in ``RunConfig``, stored in run.json, parsed from the command line, and
turned into the planner's ``Costs`` by one conversion."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from freeride_lab.cli.app import build_parser, main, run_config_fields
from freeride_lab.core.config import RunConfig, cost_text
from freeride_lab.core.plan import Costs, simulate_summary
from freeride_lab.pipeline.synthetic import build_sleep_chunks


def interleaved(**fields: Any) -> RunConfig:
    """Interleaved1F1B, 2 ranks x 2 chunks: global stages 0, 2 on rank 0 and 1, 3 on rank 1."""
    return RunConfig(
        schedule="Interleaved1F1B", stages=2, microbatches=4, workload="synthetic", **fields
    )


def test_per_stage_costs_are_tuples_in_the_config_and_lists_in_json() -> None:
    config = interleaved(t_forward_ms=[10, 10, 20, 10], t_backward_weight_ms=(1, 2, 3, 4))
    assert config.t_forward_ms == (10.0, 10.0, 20.0, 10.0)
    assert config.t_backward_weight_ms == (1.0, 2.0, 3.0, 4.0)
    stored = json.loads(config.to_json())
    assert stored["t_forward_ms"] == [10.0, 10.0, 20.0, 10.0]
    assert stored["t_backward_input_ms"] == 20.0
    assert RunConfig.from_dict(stored) == config
    assert RunConfig.from_dict(config.to_dict()) == config


def test_an_old_run_json_with_scalar_costs_still_reads() -> None:
    old = json.loads(RunConfig(workload="synthetic", t_forward_ms=7).to_json())
    old["t_forward_ms"] = 7  # as older versions wrote it: an int
    config = RunConfig.from_dict(old, check_plan=False)
    assert config.t_forward_ms == 7.0
    assert config.stage_costs_ms() == ((7.0, 20.0, 20.0),) * 4


def test_scalar_costs_are_one_ranks_cost_split_over_its_chunks() -> None:
    config = interleaved(t_forward_ms=20, t_backward_input_ms=10, t_backward_weight_ms=6)
    assert config.stage_costs_ms() == ((10.0, 5.0, 3.0),) * 4


def test_per_stage_costs_give_each_stage_chunk_its_own_values() -> None:
    config = interleaved(t_forward_ms=[1, 2, 3, 4], t_backward_input_ms=[5, 6, 7, 8])
    assert config.stage_costs_ms() == (
        (1.0, 5.0, 10.0),
        (2.0, 6.0, 10.0),
        (3.0, 7.0, 10.0),
        (4.0, 8.0, 10.0),
    )


ONE_PER_CHUNK = "one per stage chunk"


@pytest.mark.parametrize(
    ("value", "named", "rule", "fix"),
    [
        ([10, 10, 20], "t_forward_ms=[10.0, 10.0, 20.0]", "stages x chunks = 4", "one value per"),
        ([10, -1, 20, 10], "t_forward_ms[1]=-1", ">= 0", ONE_PER_CHUNK),
        ([10, 10, float("nan"), 10], "t_forward_ms[2]=nan", "finite", ONE_PER_CHUNK),
        ([10, 10, "x", 10], "t_forward_ms[2]='x'", "number", ONE_PER_CHUNK),
        ([10, 10, 1e300, 10], "t_forward_ms[2]=1e+300", "limit", "below it"),
        ([], "t_forward_ms=[]", "stages x chunks = 4", "one value per"),
        ("10,20", "t_forward_ms='10,20'", "number", ONE_PER_CHUNK),
    ],
)
def test_bad_per_stage_costs_are_refused_with_value_rule_and_fix(
    value: Any, named: str, rule: str, fix: str
) -> None:
    with pytest.raises(ValueError) as info:
        interleaved(t_forward_ms=value)
    message = str(info.value)
    assert named in message and rule in message and fix in message, message
    assert "\n" not in message


def test_costs_from_config_maps_each_stage_chunk_with_torchs_first_stage_quirk() -> None:
    config = interleaved(
        t_forward_ms=[1, 2, 3, 4], t_backward_input_ms=[5, 6, 7, 8], t_backward_weight_ms=10
    )
    costs = Costs.from_config(config, comm_ms=0.5, dispatch_ms=0.25)
    table = costs.table(4)  # columns F, B, I, W; the scalar W is split over the 2 chunks
    np.testing.assert_allclose(table[:, 0], [1, 2, 3, 4])
    np.testing.assert_allclose(table[:, 1], [10, 11, 12, 13])
    np.testing.assert_allclose(table[1:, 2:], [[6, 5], [7, 5], [8, 5]])
    np.testing.assert_allclose(table[0, 2:], [0, 10])  # stage 0: torch's W runs the whole B
    assert (costs.comm_ms, costs.dispatch_ms) == (0.5, 0.25)


def test_sleep_chunks_take_their_own_costs() -> None:
    chunks = build_sleep_chunks(4, [(1.0, 2.0, 3.0), (4.0, 5.0, 6.0)])
    got = [(c.forward_s, c.input_grad_s, c.weight_grad_s) for c in chunks]
    np.testing.assert_allclose(got, [(1e-3, 2e-3, 3e-3), (4e-3, 5e-3, 6e-3)])


def test_cost_text_shows_one_number_or_the_list() -> None:
    assert cost_text(20.0) == "20"
    assert cost_text((10.0, 10.0, 20.5, 10.0)) == "10,10,20.5,10"


def test_simulate_takes_a_comma_list_per_stage(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--schedule", "1F1B", "--stages", "4", "--microbatches", "4"]
    code = main([*argv, "--t-forward-ms", "10,10,20,10", "--t-backward-input-ms", "10",
                 "--t-backward-weight-ms", "10"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    config = RunConfig(
        stages=4, microbatches=4, workload="synthetic", t_forward_ms=[10, 10, 20, 10],
        t_backward_input_ms=10, t_backward_weight_ms=10,
    )  # fmt: skip
    want = simulate_summary("1F1B", 4, 4, costs=Costs.from_config(config))
    assert want["busy_ms"].tolist() == [120.0, 120.0, 160.0, 120.0]
    for busy, idle in zip(want["busy_ms"], want["idle_ms"], strict=True):
        assert f"{busy:.2f}" in out and f"{idle:.2f}" in out


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("10,x,20,10", "'10,x,20,10' is not a number of ms or a comma list"),
        ("10,20", "has 2 value(s)"),
        ("10,,20,10", "is not a number of ms"),
    ],
)
def test_a_bad_comma_list_is_a_one_line_usage_error(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["simulate", "--stages", "4", "--microbatches", "4", "--t-forward-ms", value])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1


def test_run_and_launch_options_build_a_config_with_per_stage_costs() -> None:
    """The grammar ``run``, ``launch`` and the ``%freeride`` magics share (``build_parser``,
    ``run_config_fields``)."""
    for command in ("run", "launch"):
        args = build_parser().parse_args(
            [command, "--workload", "synthetic", "--stages", "4", "--microbatches", "4",
             "--t-forward-ms", "10,10,20,10", "--t-backward-weight-ms", "5"]
        )  # fmt: skip
        config = RunConfig(**run_config_fields(args))
        assert config.t_forward_ms == (10.0, 10.0, 20.0, 10.0)
        assert config.t_backward_weight_ms == 5.0
