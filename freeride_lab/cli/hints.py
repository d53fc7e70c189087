"""What the command grammar offers at a point of a command line: completions and "did you mean".

Both read the ``argparse`` parser of ``freeride_lab.cli.app.build_parser`` (the one grammar), so a
new subcommand or option completes and is suggested without a change here. The notebook face
(``%freeride``) uses them for Tab completion and for its one-line errors; nothing here imports
IPython, torch or a run.

    >>> from freeride_lab.cli.app import build_parser
    >>> parser = build_parser()
    >>> complete(parser, ["attach"], "pag", {"task": ["pagerank", "vgg19"]}, run_dir_optional=True)
    ['pagerank']
    >>> complete(parser, ["attach", "runs/r1", "pagerank"], "--bud")
    ['--budget-ms']
    >>> did_you_mean("stauts", subcommands(parser))
    "did you mean 'status'?"
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence

from freeride_lab.cli.parser_parts import arguments, is_append, subcommands

__all__ = ["complete", "did_you_mean", "hint", "options", "subcommands"]


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Long option string (``--budget-ms``) → its action; ``-h``-style short forms left out."""
    return {
        flag: action
        for action in arguments(parser)
        for flag in action.option_strings
        if flag.startswith("--")
    }


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"did you mean 'status'?"`` for the choices closest to ``word``; ``""`` when none is."""
    close = difflib.get_close_matches(word, list(choices), n=2, cutoff=0.6)
    if not close:
        return ""
    return "did you mean " + " or ".join(repr(c) for c in close) + "?"


def _split(
    parser: argparse.ArgumentParser, words: Sequence[str]
) -> tuple[str | None, list[str], list[str]]:
    """``(subcommand, its positional words, its option words)`` of a partial command line.

    Global options (``--log-level DEBUG``) before the subcommand are skipped; an option's value
    is neither a positional nor an option word.
    """
    subs = subcommands(parser)
    top = options(parser)
    i = 0
    while i < len(words) and words[i].startswith("-"):
        action = top.get(words[i].partition("=")[0])
        i += 2 if action is not None and action.nargs != 0 and "=" not in words[i] else 1
    if i >= len(words):
        return None, [], []
    command, rest = words[i], words[i + 1 :]
    sub = subs.get(command)
    known = options(sub) if sub is not None else {}
    positionals: list[str] = []
    flags: list[str] = []
    j = 0
    while j < len(rest):
        word = rest[j]
        if word.startswith("-") and word != "-":
            flags.append(word)
            action = known.get(word.partition("=")[0])
            takes_value = action is not None and action.nargs != 0 and "=" not in word
            j += 2 if takes_value else 1
        else:
            positionals.append(word)
            j += 1
    return command, positionals, flags


def complete(
    parser: argparse.ArgumentParser,
    words: Sequence[str],
    token: str,
    values: Mapping[str, Iterable[str]] | None = None,
    *,
    run_dir_optional: bool = False,
    is_run_dir: Callable[[str], bool] = lambda word: False,
) -> list[str]:
    """Completions of ``token`` after the complete ``words`` of a command line (program name
    left out): subcommands, long options of the subcommand (those not given yet, unless they
    may repeat), an option's choices. ``values`` maps an argument's ``dest`` to what else may
    go there: an option without fixed choices (``"schedule"``: any case of a name) or a
    positional (``"task"``: side-task names, ``"task_id"``: the run's task ids).

    ``run_dir_optional`` is the notebook's rule (RUN_DIR may be left out): then the first
    positional fills RUN_DIR only where ``is_run_dir`` says it is one. An empty list means
    "nothing from the grammar here" (a path, a number): other completers may offer theirs.
    """
    words = list(words)
    values = values or {}
    command, positionals, flags = _split(parser, words)
    subs = subcommands(parser)
    if command is None:
        previous = options(parser).get(words[-1]) if words else None
        if previous is not None and previous.nargs != 0:
            return _starting(previous.choices or (), token)
        if token.startswith("-"):
            return _starting(options(parser), token)
        return _starting(subs, token)
    sub = subs.get(command)
    if sub is None:
        return []
    known = options(sub)
    previous = known.get(words[-1]) if words else None
    if previous is not None and previous.nargs != 0:
        return _starting(previous.choices or values.get(previous.dest, ()), token)
    if token.startswith("-"):
        given = {f.partition("=")[0] for f in flags}
        offered = [flag for flag, action in known.items() if flag not in given or is_append(action)]
        return _starting(offered, token)
    slots = [a for a in arguments(sub) if not a.option_strings]
    run_dir_given = bool(positionals) and is_run_dir(positionals[0])
    if run_dir_optional and slots and slots[0].dest == "run_dir" and not run_dir_given:
        slots = slots[1:]
    if len(positionals) < len(slots):
        return _starting(values.get(slots[len(positionals)].dest, ()), token)
    return []


def _starting(choices: Iterable[object], token: str) -> list[str]:
    return [str(c) for c in choices if str(c).startswith(token)]


def hint(parser: argparse.ArgumentParser, words: Sequence[str]) -> str:
    """A "did you mean" for the first unknown subcommand or long option in ``words``; ``""``
    when every word is known (or nothing known is close)."""
    command, _, flags = _split(parser, words)
    subs = subcommands(parser)
    if command is None:
        return ""
    if command not in subs:
        return did_you_mean(command, subs)
    known = options(subs[command])
    for flag in flags:
        name = flag.partition("=")[0]
        if not name.startswith("--") or name in known:
            continue
        if sum(1 for k in known if k.startswith(name)) == 1:  # argparse takes a unique prefix
            continue
        suggestion = did_you_mean(name, known)
        if suggestion:
            return suggestion
    return ""
