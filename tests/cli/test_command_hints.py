"""Completions and "did you mean" read off the command grammar (``freeride_lab.cli.hints``).

Pure: the parser of ``freeride_lab.cli.app.build_parser``, no shell and no run.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from freeride_lab.cli.app import build_parser
from freeride_lab.cli.hints import complete, did_you_mean, hint, options, subcommands

PARSER = build_parser()
TASKS = ["pagerank", "resnet18", "resnet50"]
VALUES = {"task": TASKS, "task_id": ["t1", "t2"], "schedule": ["1F1B", "GPipe"]}
COMMANDS = sorted(subcommands(PARSER))
OPTION_WORDS = sorted({(c, o) for c in COMMANDS for o in options(subcommands(PARSER)[c])})


def test_every_subcommand_completes_from_any_prefix():
    for name in COMMANDS:
        for cut in range(len(name) + 1):
            assert name in complete(PARSER, [], name[:cut])


def test_the_cli_needs_the_run_directory_before_the_task():
    # freeride-lab attach RUN_DIR TASK: the first word is the run directory, not a task
    assert complete(PARSER, ["attach"], "pag", VALUES) == []
    assert complete(PARSER, ["attach", "runs/r1"], "pag", VALUES) == ["pagerank"]


def test_the_notebook_may_leave_the_run_directory_out():
    words = ["attach"]
    assert complete(PARSER, words, "res", VALUES, run_dir_optional=True) == TASKS[1:]
    given_dir = complete(
        PARSER,
        ["attach", "runs/r1"],
        "pag",
        VALUES,
        run_dir_optional=True,
        is_run_dir=lambda word: word == "runs/r1",
    )
    assert given_dir == ["pagerank"]


def test_task_ids_and_named_values_complete_where_they_go():
    assert complete(PARSER, ["tune", "runs/r1"], "t", VALUES) == ["t1", "t2"]
    assert complete(PARSER, ["tune", "runs/r1", "t1"], "", VALUES) == []
    assert complete(PARSER, ["launch", "--schedule"], "G", VALUES) == ["GPipe"]


def test_options_may_repeat_only_where_the_grammar_says():
    words = ["attach", "runs/r1", "pagerank", "--option", "a=1", "--stage", "1"]
    offered = complete(PARSER, words, "--", VALUES)
    assert "--option" in offered and "--stage" not in offered


def test_global_options_before_the_subcommand_are_skipped():
    assert complete(PARSER, ["--log-level"], "D", VALUES) == ["DEBUG"]
    assert complete(PARSER, ["--log-level", "DEBUG"], "sta", VALUES) == ["status"]
    assert hint(PARSER, ["--log-level", "DEBUG", "stauts"]) == "did you mean 'status'?"


def test_a_path_or_a_number_is_left_to_other_completers():
    assert complete(PARSER, ["report", "runs/r1"], "", VALUES) == []
    assert complete(PARSER, ["launch", "--stages"], "", VALUES) == []


@given(st.sampled_from(OPTION_WORDS), st.data())
def test_a_known_option_or_its_unique_prefix_gets_no_hint(pair, data):
    command, flag = pair
    known = options(subcommands(PARSER)[command])
    cut = data.draw(st.integers(3, len(flag)))
    prefix = flag[:cut]
    if sum(1 for k in known if k.startswith(prefix)) == 1 or prefix in known:
        assert hint(PARSER, [command, prefix]) == ""


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["stauts"], "did you mean 'status'?"),
        (["attahc"], "did you mean 'attach'?"),
        (["attach", "r", "pagerank", "--budgetms", "5"], "did you mean '--budget-ms'?"),
        (["launch", "--microbatchs", "4"], "did you mean '--microbatches'"),
        (["launch", "--steps=5"], ""),
        (["zzzz"], ""),
    ],
)
def test_hint_names_the_closest_known_word(words, expected):
    assert expected in hint(PARSER, words) if expected else hint(PARSER, words) == ""


def test_did_you_mean_offers_at_most_two():
    offered = did_you_mean("resnet", [*TASKS, "resnet34"])
    assert offered.startswith("did you mean 'resnet") and offered.count("'resnet") == 2
    assert did_you_mean("xyz", TASKS) == ""
