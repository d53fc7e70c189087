"""The command grammar as the notebook face (``%freeride``) reads it.

The CLI's parser (``freeride_lab.cli.app.build_parser``) is the one grammar; this module adapts
it for the notebook without importing IPython: RUN_DIR and the report's PATH become optional
(:func:`notebook_parser`), help is written for notebook users (:func:`help_text`), the current
run's directory is put in where it was left out (:func:`with_run_dir`), and a ``%freeride`` line
is completed (:func:`complete_line`).

[Note: the current run]
For a subcommand whose first positional is ``RUN_DIR`` (status, attach, tune, checkpoint,
detach, stop, report), the magic inserts the current session's run directory unless the first
word after the subcommand already is a run directory (a directory holding ``run.json``). So
``%freeride attach pagerank --stage 1`` is ``freeride-lab attach <current run> pagerank --stage 1``
and ``%freeride attach runs/other pagerank`` still addresses another run.

    >>> parser = notebook_parser()
    >>> with_run_dir(["status"], parser, Path("/runs/r1"))
    ['status', '/runs/r1']
    >>> complete_line("%freeride sta", "sta", parser, {})
    (['status'], 'sta')
"""

from __future__ import annotations

import argparse
import contextlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "PROG",
    "REPORT_NAME",
    "complete_line",
    "completions",
    "config_changes",
    "help_text",
    "is_run_dir",
    "notebook_parser",
    "number",
    "run_dir_commands",
    "task_lines",
    "task_ref",
    "user_task_names",
    "with_hint",
    "with_run_dir",
]

PROG = "%freeride"
_MAGIC_LINE = re.compile(r"^\s*%freeride\s(?P<rest>.*)$")
#: Where ``%freeride report`` without a PATH writes (``<run_id>`` made file-name safe).
REPORT_NAME = "freeride-report-<run_id>/report.html"

_HELP = """\
%freeride COMMAND ... — train a pipeline in the background and run side tasks in its bubbles.

Every `freeride-lab` command works here, with notebook manners: RUN_DIR may be left out (it
means the run this kernel launched, named `session`), `launch` keeps the run in the kernel and
shows its live dashboard, and `report` links the report it writes. Tab completes commands,
side-task names and --options; a typo gets a "did you mean".

Example session:

    %freeride launch --stages 4 --microbatches 8 --steps 500 --workload synthetic
    %freeride attach pagerank --stage 1 --budget-ms 50
    %freeride report

Commands ([...] may be left out; `%freeride COMMAND --help` lists every option):

{commands}

Side tasks: {tasks};
or a class of your own: write it in a cell under `%%freeride_task NAME`, then
`%freeride attach NAME`.
"""

#: What a command does in the notebook, where it differs from the CLI's one-line help.
_NOTEBOOK_HELP = {
    "run": "the same as launch: in a notebook a run never blocks the kernel",
    "launch": "start a run in this kernel and show its live dashboard",
    "attach": "run a side task in the run's bubbles (built-in, %%freeride_task or module:Class)",
    "stop": "stop the run (SIGTERM, grace, SIGKILL); its files stay",
    "report": "write the run's HTML report and tables (default ./freeride-report-<run_id>/)",
}


def notebook_parser() -> argparse.ArgumentParser:
    """The CLI's grammar, as the notebook reads it (see [Note: the current run]): RUN_DIR and
    the report's PATH are shown, and parsed, as optional."""
    from freeride_lab.cli.app import build_parser
    from freeride_lab.cli.hints import subcommands

    parser = build_parser(prog=PROG)
    for name, sub in subcommands(parser).items():
        for action in sub._actions:
            if action.dest == "run_dir" and not action.option_strings:
                action.metavar = "[RUN_DIR]"  # filled in before parsing where it is left out
                action.help = "the run directory (default: the run this kernel launched)"
            elif name == "report" and action.dest == "path":
                action.nargs, action.required, action.default = "?", False, None
                action.metavar = "PATH"
                action.help = f"where the report goes (default: ./{REPORT_NAME})"
    return parser


def help_text() -> str:
    """The magic's docstring (``%freeride?``): for notebook users, built from the grammar."""
    from freeride_lab.cli.hints import subcommands
    from freeride_lab.tasks import registry

    parser = notebook_parser()
    helps: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: str(choice.help or "") for choice in action._choices_actions}
    rows = []
    for name, sub in subcommands(parser).items():
        words = [f"%freeride {name}"]
        for a in sub._actions:
            if not a.option_strings:
                word = str(a.metavar or a.dest.upper())
                words.append(f"[{word}]" if a.nargs == "?" else word)
        if any(a.option_strings and a.dest != "help" for a in sub._actions):
            words.append("[--options]")
        rows.append((" ".join(words), _NOTEBOOK_HELP.get(name, helps.get(name, ""))))
    commands = "\n".join(f"    {usage}\n        {what}" for usage, what in rows)
    return _HELP.format(commands=commands, tasks=", ".join(registry.names()))


def run_dir_commands(parser: argparse.ArgumentParser) -> set[str]:
    """Subcommands whose first positional argument is ``run_dir``."""
    found: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                positionals = [a for a in sub._actions if not a.option_strings]
                if positionals and positionals[0].dest == "run_dir":
                    found.add(name)
    return found


def is_run_dir(word: str) -> bool:
    """True for a path to a run directory (one holding ``run.json``)."""
    return not word.startswith("-") and (Path(word).expanduser() / "run.json").is_file()


def with_run_dir(
    argv: list[str], parser: argparse.ArgumentParser, current: Path | None
) -> list[str]:
    """``argv`` with ``current`` put in as RUN_DIR where it was left out (see [Note: the
    current run]).

    Raises:
        freeride_lab.cli.app.UsageError: RUN_DIR was left out and there is no current run.
    """
    commands = run_dir_commands(parser)
    at = next((i for i, word in enumerate(argv) if word in commands), None)
    if at is None:
        return argv
    given = argv[at + 1 : at + 2]
    if given and (is_run_dir(given[0]) or given[0] in ("-h", "--help")):
        return argv
    if current is None:
        from freeride_lab.cli.app import UsageError

        raise UsageError(
            f"{argv[at]}: no run in this kernel yet; start one with "
            "`%freeride launch --stages 4 --workload synthetic`, or give its RUN_DIR"
        )
    return [*argv[: at + 1], str(current), *argv[at + 1 :]]


def with_hint(message: str, suggestion: str) -> str:
    """``message`` with its "did you mean" (if any) at the end, still one line."""
    return f"{message}; {suggestion}" if suggestion else message


def complete_line(
    line: str,
    token: str,
    parser: argparse.ArgumentParser,
    values: Mapping[str, Sequence[str]],
) -> tuple[list[str], str]:
    """Completions of the ``%freeride`` line ``line`` (the text up to the cursor) at
    ``token`` (the word IPython completes), from the grammar, and the fragment they replace;
    ``[]`` where it has nothing to offer or the line is no ``%freeride`` line. ``values``
    lists the words a positional or option may take, by its dest (``task``, ``task_id``,
    ``schedule``, ``policy``)."""
    from freeride_lab.cli.hints import complete

    match = _MAGIC_LINE.match(line)
    if match is None:
        return [], ""
    rest = match.group("rest")
    words = rest.split()
    typed = "" if not rest or rest[-1].isspace() else words.pop()
    if not token.endswith(typed):  # IPython splits at "=", ":" and such
        return [], typed
    found = complete(parser, words, typed, values, run_dir_optional=True, is_run_dir=is_run_dir)
    return found, typed


def config_changes(
    old: Mapping[str, Any], new: Mapping[str, Any], *, run_dir: str | None, current_run_dir: Path
) -> str:
    """``"steps: 20 → 30, …"``: what a launch asks for (``new``, a ``RunConfig.to_dict()``) that
    the live run (config ``old``, in ``current_run_dir``) differs in.

    ``run_dir`` and ``master_port`` count only when given, ``runtime`` and ``notes`` (filled
    in by the session, and not settable from the command line) never.
    """
    changes = [
        f"{k}: {old.get(k)!r} → {v!r}"
        for k, v in new.items()
        if k not in ("run_dir", "master_port", "runtime", "notes") and old.get(k) != v
    ]
    if new.get("master_port") is not None and new.get("master_port") != old.get("master_port"):
        changes.append(f"master_port: {old.get('master_port')} → {new.get('master_port')}")
    if run_dir is not None and Path(run_dir).expanduser().absolute() != current_run_dir:
        changes.append(f"run_dir: {str(current_run_dir)!r} → {run_dir!r}")
    return ", ".join(changes)


def user_task_names(tasks_dir: Path) -> list[str]:
    """Names of the ``%%freeride_task`` tasks in ``tasks_dir`` (one ``NAME.json`` each), read
    without importing the dashboard (Tab must answer at once)."""
    with contextlib.suppress(OSError):
        return sorted(p.stem for p in tasks_dir.glob("*.json") if p.with_suffix(".py").is_file())
    return []


def completions(
    line: str,
    token: str,
    parser: argparse.ArgumentParser,
    tasks_dir: Path,
    task_ids: Sequence[str],
) -> tuple[list[tuple[str, str]], str]:
    """(text, kind) completions of a ``%freeride`` line (kind: command, option, task or
    value) and the fragment they replace: :func:`complete_line` with the built-in and
    ``%%freeride_task`` task names, the current run's ``task_ids``, schedules and policies."""
    from freeride_lab.cli.hints import subcommands
    from freeride_lab.core.budget import OverrunPolicy
    from freeride_lab.core.schedule import SCHEDULES
    from freeride_lab.tasks import registry

    tasks = list(dict.fromkeys([*registry.names(), *user_task_names(tasks_dir)]))
    values = {
        "task": tasks,
        "task_id": list(task_ids),
        "schedule": list(SCHEDULES),
        "policy": [str(p) for p in OverrunPolicy],
    }
    found, typed = complete_line(line, token, parser, values)
    commands = subcommands(parser)

    def kind(text: str) -> str:
        if text.startswith("-"):
            return "option"
        return "task" if text in tasks else "command" if text in commands else "value"

    return [(text, kind(text)) for text in found], typed


def number(value: Any) -> str:
    """A progress count as ``%g`` writes it (anything else as text)."""
    return f"{value:g}" if isinstance(value, int | float) else str(value)


def task_lines(tasks: Sequence[Mapping[str, Any]]) -> list[str]:
    """``%freeride status``'s side-task lines: id, name, stage, state, progress, overruns and
    the error of a failed task; a hint to attach one where there are none."""
    if not tasks:
        return ["side tasks: none (attach one with `%freeride attach pagerank --stage 1`)"]
    lines = ["side tasks:"]
    for t in tasks:
        error = f" — {t['error']}" if t.get("error") else ""
        lines.append(
            f"  {t.get('id')}  {t.get('name')}  stage {t.get('stage')}  {t.get('state')}  "
            f"{number(t.get('progress'))} {t.get('unit') or ''}  "
            f"overruns {t.get('overruns', 0)}{error}"
        )
    return lines


def task_ref(name: str, tasks_dir: Path, task_ids: Sequence[str]) -> str:
    """The reference ``%freeride attach`` passes for ``name``: a ``%%freeride_task``'s file,
    else ``name`` itself (a built-in, ``module:Class`` or one of the run's ``task_ids`` to
    resume).

    Raises:
        freeride_lab.cli.app.UsageError: a near miss of a known name, with a "did you mean".
    """
    from freeride_lab.cli.hints import did_you_mean
    from freeride_lab.tasks import registry
    from freeride_lab.ui.dashboard import user_tasks

    mine = user_tasks(tasks_dir)
    task = mine.get(name)
    if task is not None:
        return task.ref
    if ":" in name or registry.is_known(name):
        return name  # Session.attach resolves it through the registry
    if name in task_ids:
        return name  # a detached task's id: attach resumes it
    known = list(dict.fromkeys([*registry.names(), *mine]))
    suggestion = did_you_mean(name, known)
    if suggestion:
        from freeride_lab.cli.app import UsageError

        raise UsageError(
            f"attach: unknown side task {name!r}; {suggestion} (known: {', '.join(known)})"
        )
    return name
