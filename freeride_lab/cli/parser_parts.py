"""The parts of an ``argparse`` parser that argparse has no public way to list, in one place.

The hints, tab completion and the notebook magic's help walk the CLI's own parser: its
arguments, its subcommands and their one-line help. argparse keeps these in private attributes
(``_actions``, ``_SubParsersAction``, ``_choices_actions``, ``_AppendAction``); every read of
them is here, so a Python release that changes them breaks this module alone
(``tests/cli/test_parser_parts.py``).

    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="demo")
    >>> _ = parser.add_argument("--steps")
    >>> subs = parser.add_subparsers()
    >>> _ = subs.add_parser("run", help="start a run")
    >>> [a.dest for a in arguments(parser)], subcommand_helps(parser)
    (['help', 'steps', '==SUPPRESS=='], {'run': 'start a run'})
"""

from __future__ import annotations

import argparse

__all__ = ["arguments", "is_append", "subcommand_helps", "subcommands"]


def arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Every argument of ``parser`` (options, positionals, the subcommand slot), in order."""
    return list(parser._actions)


SubParsers = argparse._SubParsersAction  # the subcommand slot ``add_subparsers`` returns


def _subparsers(parser: argparse.ArgumentParser) -> SubParsers[argparse.ArgumentParser] | None:
    for action in parser._actions:
        if isinstance(action, SubParsers):
            return action
    return None


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Subcommand name → its parser, in help order (empty for a parser without subcommands)."""
    action = _subparsers(parser)
    return {} if action is None else dict(action.choices)


def subcommand_helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Subcommand name → its one-line help ("" where none was given)."""
    action = _subparsers(parser)
    if action is None:
        return {}
    return {choice.dest: str(choice.help or "") for choice in action._choices_actions}


def is_append(action: argparse.Action) -> bool:
    """Whether ``action`` collects repeated options (``action="append"``)."""
    return isinstance(action, argparse._AppendAction)
