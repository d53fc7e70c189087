"""``cli.parser_parts`` reads the CLI's own parser as argparse builds it: the hints, Tab
completion and the magic's help see every subcommand, its help line and its arguments."""

from __future__ import annotations

from freeride_lab.cli.app import build_parser
from freeride_lab.cli.parser_parts import arguments, is_append, subcommand_helps, subcommands


def test_every_subcommand_is_listed_with_its_one_line_help() -> None:
    parser = build_parser()
    helps = subcommand_helps(parser)
    assert list(helps) == list(subcommands(parser))
    assert {"launch", "attach", "report", "stop"} <= set(helps)
    assert all(helps.values()), helps


def test_a_subcommands_arguments_include_its_positionals_and_options() -> None:
    attach = subcommands(build_parser())["attach"]
    flags = {flag for action in arguments(attach) for flag in action.option_strings}
    positionals = [a.dest for a in arguments(attach) if not a.option_strings]
    assert "--budget-ms" in flags and positionals[0] == "run_dir"


def test_a_repeatable_option_is_told_from_a_single_one() -> None:
    attach = subcommands(build_parser())["attach"]
    by_flag = {flag: a for a in arguments(attach) for flag in a.option_strings}
    assert is_append(by_flag["--option"]) and not is_append(by_flag["--budget-ms"])


def test_a_parser_without_subcommands_has_none() -> None:
    attach = subcommands(build_parser())["attach"]
    assert subcommands(attach) == {} and subcommand_helps(attach) == {}


def test_attach_offers_exactly_the_gatings_a_task_spec_takes() -> None:
    from freeride_lab.sidetasks.spec import GATINGS

    attach = subcommands(build_parser())["attach"]
    (gating,) = [a for a in arguments(attach) if "--gating" in a.option_strings]
    assert list(gating.choices) == list(GATINGS)  # the CLI spells them out to stay numpy-free
