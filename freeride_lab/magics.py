"""``%load_ext freeride_lab``: the ``%freeride`` line magic and the ``%%freeride_task`` cell magic.

    %load_ext freeride_lab
    %freeride launch --schedule 1F1B --stages 4 --microbatches 4 --steps 50 --workload synthetic
    %freeride attach pagerank --stage 1 --budget-ms 50
    %freeride status
    %freeride report
    %freeride stop

``%freeride`` parses its line with the command line's own parser (``freeride_lab.cli.app.
build_parser``), so the two faces share one grammar; ``%freeride?`` (and a bare ``%freeride``)
shows help written for the notebook, with an example session, built from that grammar. Tab
completes commands, side-task names, the current run's task ids, options and their fixed
values, and a typo'd command, option or task name gets a "did you mean" (both read off the
grammar by ``freeride_lab.cli.hints``). ``report`` without a PATH writes
``./freeride-report-<run_id>/report.html`` (the tables and traces go in that folder) and
displays a link to it. One difference, see [Note: the current run]: where the CLI needs a
``RUN_DIR``, the notebook may leave it out and means the *current* session — the one
``launch`` started, held by the :class:`FreerideMagics` instance and named ``session`` in the
notebook. ``launch`` starts the run
in the kernel (its processes stay in the kernel's process group; the CLI's ``launch`` detaches a
keeper instead), returns at once and displays the live dashboard (``freeride_lab.ui.dashboard``);
running the same launch cell again while that run is live reuses it and says so. Bad input is
one ``UsageError`` line, never a traceback.

[Note: the current run]
For a subcommand whose first positional is ``RUN_DIR`` (status, attach, tune, detach, stop,
report), the magic inserts the current session's run directory unless the first word after the
subcommand already is a run directory (a directory holding ``run.json``). So
``%freeride attach pagerank --stage 1`` is ``freeride-lab attach <current run> pagerank --stage 1``
and ``%freeride attach runs/other pagerank`` still addresses another run.

``%%freeride_task NAME`` writes its cell to ``./.freeride_tasks/NAME.py`` (spawned side-task
processes cannot unpickle classes defined in a notebook), checks that it defines exactly one
``IterativeSideTask``/``ImperativeSideTask`` subclass, and registers it as NAME for
``%freeride attach NAME`` and the board's palette (see [Note: user side tasks] in
``freeride_lab.ui.dashboard``).

Loading imports no torch and starts nothing; ``%unload_ext freeride_lab`` removes the magics
and stops every dashboard pump; ``%reload_ext`` does not start a second one.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import importlib.util
import math
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

if TYPE_CHECKING:
    from IPython.core.completer import CompletionContext, SimpleMatcherResult
    from IPython.core.interactiveshell import InteractiveShell

    from freeride_lab.lab.session import Session
    from freeride_lab.sidetasks.api import SideTaskBase

__all__ = ["FreerideMagics", "load", "unload"]

PROG = "%freeride"
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
_MAGIC_LINE = re.compile(r"^\s*%freeride\s(?P<rest>.*)$")


def _parser() -> argparse.ArgumentParser:
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
                action.help = f"where the report goes (default: ./{_REPORT_NAME})"
    return parser


_REPORT_NAME = "freeride-report-<run_id>/report.html"

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


def _help_text() -> str:
    """The magic's docstring (``%freeride?``): for notebook users, built from the grammar."""
    from freeride_lab.cli.hints import subcommands
    from freeride_lab.tasks import BUILTIN_TASKS

    parser = _parser()
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
    return _HELP.format(commands=commands, tasks=", ".join(BUILTIN_TASKS))


def _run_dir_commands(parser: argparse.ArgumentParser) -> set[str]:
    """Subcommands whose first positional argument is ``run_dir``."""
    found: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                positionals = [a for a in sub._actions if not a.option_strings]
                if positionals and positionals[0].dest == "run_dir":
                    found.add(name)
    return found


def _is_run_dir(word: str) -> bool:
    return not word.startswith("-") and (Path(word).expanduser() / "run.json").is_file()


def _is_session(value: Any) -> bool:
    cls = type(value)
    return cls.__name__ == "Session" and cls.__module__ == "freeride_lab.lab.session"


@magics_class
class FreerideMagics(Magics):
    """The ``%freeride`` and ``%%freeride_task`` magics; holds the kernel's current session.

    Args:
        tasks_dir: where ``%%freeride_task`` writes user tasks (default ``./.freeride_tasks``).
    """

    def __init__(self, shell: InteractiveShell, *, tasks_dir: Path | None = None) -> None:
        super().__init__(shell)
        self._session: Session | None = None
        self._parser_cache: argparse.ArgumentParser | None = None
        self.tasks_dir = Path(tasks_dir) if tasks_dir is not None else Path(".freeride_tasks")

    def __repr__(self) -> str:
        session = self._session
        return f"<FreerideMagics session={getattr(session, 'run_id', None)!r}>"

    # -- the current session -------------------------------------------------------------------

    @property
    def session(self) -> Session | None:
        """The current session: the last one launched here, else a ``Session`` the notebook
        names ``session`` (so a run survives ``%reload_ext``)."""
        if self._session is None and self.shell is not None:
            candidate = self.shell.user_ns.get("session")
            if _is_session(candidate):
                self._session = candidate
        return self._session

    @session.setter
    def session(self, value: Session | None) -> None:
        self._session = value
        if value is not None and self.shell is not None:
            self.shell.user_ns["session"] = value

    def _current(self, args: argparse.Namespace) -> Session:
        """The session a command acts on: the current one, or the run ``args.run_dir`` names."""
        from freeride_lab.lab.session import Session

        current = self.session
        path = Path(args.run_dir).expanduser().absolute()
        if current is not None and path == current.run_dir.path:
            return current
        return Session.open(path)

    def _with_run_dir(self, argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
        """``argv`` with the current run's directory put in as RUN_DIR where it was left out
        (see [Note: the current run])."""
        commands = _run_dir_commands(parser)
        at = next((i for i, word in enumerate(argv) if word in commands), None)
        if at is None:
            return argv
        given = argv[at + 1 : at + 2]
        if given and (_is_run_dir(given[0]) or given[0] in ("-h", "--help")):
            return argv
        session = self.session
        if session is None:
            raise UsageError(
                f"{argv[at]}: no run in this kernel yet; start one with "
                "`%freeride launch --stages 4 --workload synthetic`, or give its RUN_DIR"
            )
        return [*argv[: at + 1], str(session.run_dir.path), *argv[at + 1 :]]

    # -- %freeride -----------------------------------------------------------------------------

    @line_magic
    def freeride(self, line: str) -> None:
        """(replaced by the parser's help when the extension loads)"""
        try:
            argv = shlex.split(line)
        except ValueError as exc:
            raise UsageError(f"cannot split {line!r}: {exc}") from None
        parser = _parser()
        if not argv:
            print(_help_text())
            return
        from freeride_lab.cli.app import UsageError as CliUsageError
        from freeride_lab.cli.hints import hint

        typed = argv
        argv = self._with_run_dir(argv, parser)
        try:
            args = parser.parse_args(argv)
        except CliUsageError as exc:
            raise UsageError(_with_hint(str(exc), hint(parser, typed))) from None
        except SystemExit:  # --help printed; never let argparse end the kernel
            return
        command = str(args.command)
        handler = self._commands().get(command, self._delegate)
        try:
            handler(args)
        except UsageError:
            raise
        except CliUsageError as exc:
            raise UsageError(str(exc)) from None
        except (ValueError, TypeError, RuntimeError, OSError, TimeoutError, LookupError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            raise UsageError(f"{command}: {message}") from None

    def _commands(self) -> dict[str, Callable[[argparse.Namespace], None]]:
        return {
            "launch": self._launch,
            "run": self._launch,  # in a notebook a run never blocks the kernel
            "status": self._status,
            "attach": self._attach,
            "tune": self._tune,
            "detach": self._detach,
            "stop": self._stop,
            "report": self._report,
        }

    def _delegate(self, args: argparse.Namespace) -> None:
        """Commands with nothing kernel-specific (``list``, ``simulate``) run as in the CLI."""
        spec = getattr(args, "handler", None)
        if not spec:
            raise UsageError(f"{args.command}: not available in the notebook")
        module_name, _, attr = str(spec).partition(":")
        handler = getattr(importlib.import_module(module_name), attr)
        with contextlib.suppress(SystemExit):  # argparse-style exits must not end the kernel
            handler(args)

    # launch --------------------------------------------------------------------------------------

    def _launch(self, args: argparse.Namespace) -> None:
        from freeride_lab.cli.app import run_config_fields
        from freeride_lab.core.config import RunConfig
        from freeride_lab.lab.session import Session

        min_ms = getattr(args, "min_bubble_ms", None)
        if min_ms is not None and not (math.isfinite(min_ms) and min_ms >= 0):
            raise UsageError(f"--min-bubble-ms={min_ms!r} must be a finite number >= 0")
        config = RunConfig(**run_config_fields(args))
        current = self.session
        if current is not None and current.owner and not current.state.done:
            differs = _config_changes(current, config, run_dir=args.run_dir)
            if differs:
                raise UsageError(
                    f"run {current.run_id} is still running (step {current.steps_done}/"
                    f"{current.config.steps}) with another config ({differs}); "
                    "`%freeride stop` it first"
                )
            print(
                f"run {current.run_id} is already live with this config: reusing it "
                f"(step {current.steps_done}/{current.config.steps}); `%freeride stop` ends it"
            )
            self._show(current)
            return
        session = Session.launch(config, run_dir=args.run_dir, grace_s=args.grace_s)
        if getattr(args, "min_bubble_ms", None):
            session.bubble_min_ms = float(args.min_bubble_ms)
        self.session = session
        print(
            f"launched run {session.run_id} in {session.run_dir.path}; it trains in the "
            "background, `session` names it and the dashboard below follows it"
        )
        self._show(session)

    def _show(self, session: Session) -> None:
        """Display the session (its dashboard, where the frontend shows widgets)."""
        from IPython.display import display

        from freeride_lab.ui.dashboard import dashboard_for

        dashboard_for(session, tasks_dir=self.tasks_dir)
        display(session)  # type: ignore[no-untyped-call]

    # status / stop / report ----------------------------------------------------------------------

    def _status(self, args: argparse.Namespace) -> None:
        session = self._current(args)
        state = session.state
        print(
            f"run {session.run_id}: {state}, step {session.steps_done}/{session.config.steps}, "
            f"{session.config.schedule} S={session.config.stages} M={session.config.microbatches}"
        )
        print(f"run directory: {session.run_dir.path}")
        failure = session.failure
        if failure is not None:
            print(f"failure: {failure.reason}")
        tasks = _tasks(session)
        if not tasks:
            print("side tasks: none (attach one with `%freeride attach pagerank --stage 1`)")
            return
        print("side tasks:")
        for t in tasks:
            error = f" — {t['error']}" if t.get("error") else ""
            print(
                f"  {t.get('id')}  {t.get('name')}  stage {t.get('stage')}  {t.get('state')}  "
                f"{_num(t.get('progress'))} {t.get('unit') or ''}  "
                f"overruns {t.get('overruns', 0)}{error}"
            )

    def _stop(self, args: argparse.Namespace) -> None:
        from freeride_lab.ui.dashboard import existing_dashboard

        session = self._current(args)
        session.stop(grace_s=args.grace_s)
        dash = existing_dashboard(session)
        if dash is not None:
            dash.tick()  # show the final state at once
            dash.stop()
        print(
            f"run {session.run_id} {session.state} after "
            f"{session.steps_done}/{session.config.steps} steps; its files stay in "
            f"{session.run_dir.path}"
        )

    def _report(self, args: argparse.Namespace) -> None:
        """Write the report (by default into its own folder in the kernel's directory: the
        tables and traces go beside the HTML) and display a link to it."""
        from IPython.display import display

        session = self._current(args)
        target = args.path
        if target is None:
            safe_id = re.sub(r"[^A-Za-z0-9._-]+", "_", str(session.run_id)).strip("._") or "run"
            target = _REPORT_NAME.replace("<run_id>", safe_id)
        path = Path(session.report(target))
        print(
            f"report written to {path} (self-contained HTML; Parquet tables, summary.json and "
            f"per-rank Chrome traces beside it in {path.parent})"
        )
        display(_report_link(path))  # type: ignore[no-untyped-call]

    # side tasks ----------------------------------------------------------------------------------

    def _task_ref(self, name: str, session: Session) -> str:
        """The reference ``attach`` passes for ``name``: a ``%%freeride_task``'s file, else
        ``name`` itself; a near miss of a known name is refused with a "did you mean"."""
        from freeride_lab.cli.hints import did_you_mean
        from freeride_lab.tasks import BUILTIN_TASKS
        from freeride_lab.ui.dashboard import user_tasks

        mine = user_tasks(self.tasks_dir)
        task = mine.get(name)
        if task is not None:
            return task.ref
        if ":" in name or name.lower().replace("-", "_") in BUILTIN_TASKS:
            return name
        if any(str(t.get("id")) == name for t in _tasks(session)):
            return name  # a detached task's id: attach resumes it
        suggestion = did_you_mean(name, [*BUILTIN_TASKS, *mine])
        if suggestion:
            raise UsageError(
                f"attach: unknown side task {name!r}; {suggestion} (built-in: "
                f"{', '.join(BUILTIN_TASKS)}; from %%freeride_task: {', '.join(mine) or 'none'})"
            )
        return name

    def _attach(self, args: argparse.Namespace) -> None:
        from freeride_lab.cli.runs import _options

        session = self._current(args)
        task = session.attach(
            self._task_ref(args.task, session),
            stage=args.stage,
            memory=args.memory,
            sm_pct=args.sm,
            priority=1 if args.priority is None else args.priority,
            budget_ms=args.budget_ms,
            options=_options(args.option) or None,
            policy=args.policy,
            gating=args.gating,
        )
        print(
            f"attached {task['name']} as {task['id']} on stage {task['stage']} "
            f"({task['state']}); `%freeride status` shows its progress"
        )

    def _tune(self, args: argparse.Namespace) -> None:
        session = self._current(args)
        limits = {
            "memory": args.memory,
            "sm_pct": args.sm,
            "priority": args.priority,
            "budget_ms": args.budget_ms,
        }
        if all(v is None for v in limits.values()):
            raise UsageError(
                "tune: nothing to change; give --memory, --sm, --priority or --budget-ms"
            )
        task = session.tune(args.task_id, **limits)
        keys = ("memory_bytes", "sm_pct", "priority", "budget_ms")
        shown = ", ".join(f"{k}={task.get(k)}" for k in keys)
        print(f"tuned {task['id']} ({task['name']}): {shown}")

    def _detach(self, args: argparse.Namespace) -> None:
        session = self._current(args)
        task = session.detach(args.task_id)
        print(
            f"detached {task['id']} ({task['name']}) after {_num(task.get('progress'))} "
            f"{task.get('unit') or ''}; `%freeride attach {task['id']}` resumes it"
        )

    # -- %%freeride_task -----------------------------------------------------------------------

    @cell_magic
    def freeride_task(self, line: str, cell: str) -> None:
        """%%freeride_task NAME — make this cell's side-task class attachable as NAME.

        The cell must define exactly one subclass of ``IterativeSideTask`` or
        ``ImperativeSideTask`` and import what it uses (it runs as its own module, in the
        side-task process too). It is written to ``./.freeride_tasks/NAME.py``; then
        ``%freeride attach NAME --stage 1`` attaches it and the dashboard's palette offers it.
        The class is also defined in the notebook, to try it out by hand. A cell that raises
        anything while it runs (``sys.exit()``, ``KeyboardInterrupt`` and endless recursion
        included) is refused with one ``UsageError`` line; the kernel goes on.
        """
        from freeride_lab.sidetasks.loader import load_task_class
        from freeride_lab.tasks import BUILTIN_TASKS
        from freeride_lab.ui.dashboard import UserTask

        name = line.strip()
        if not _NAME_RE.match(name):
            raise UsageError(
                f"%%freeride_task needs one NAME (letters, digits, _ or -), got {line.strip()!r}"
            )
        if name.lower().replace("-", "_") in BUILTIN_TASKS:
            raise UsageError(
                f"{name!r} is a built-in side task; pick another NAME "
                f"(built-in: {', '.join(BUILTIN_TASKS)})"
            )
        try:
            compile(cell, f"<%%freeride_task {name}>", "exec")
        except SyntaxError as exc:
            raise UsageError(f"{name}: line {exc.lineno}: {exc.msg}") from None
        self.tasks_dir.mkdir(parents=True, exist_ok=True)
        path = (self.tasks_dir / f"{name}.py").absolute()
        path.write_text(
            f"# written by %%freeride_task {name}; edit the notebook cell, not this file\n{cell}",
            encoding="utf-8",
        )
        _forget_module(path)
        cls = _the_task_class(name, path)
        ref = f"{path}:{cls.__name__}"
        try:
            load_task_class(ref)  # what the side-task process will do
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        except BaseException as exc:  # see _the_task_class
            raise UsageError(_cell_failure(name, exc)) from None
        UserTask(name=name, ref=ref, unit=str(cls.unit), title=name).save(self.tasks_dir)
        if self.shell is not None:
            self.shell.user_ns[cls.__name__] = cls
        print(
            f"side task {name!r} ({cls.__name__}, progress in {cls.unit}) saved to {path}; "
            f"attach it with `%freeride attach {name} --stage 1`"
        )

    # -- Tab completion ------------------------------------------------------------------------

    def complete(self, context: CompletionContext) -> SimpleMatcherResult:
        """IPython matcher (API v2) for ``%freeride`` lines: subcommands, task names and
        --options from the grammar (``freeride_lab.cli.hints``).

        Anything else, and a place where the grammar has nothing to offer (a path, a number),
        is left to IPython's other matchers.
        """
        from IPython.core.completer import SimpleCompletion

        nothing: SimpleMatcherResult = {"completions": [], "suppress": False}
        match = _MAGIC_LINE.match(context.text_until_cursor)
        if match is None:
            return nothing
        rest = match.group("rest")
        words = rest.split()
        token = "" if not rest or rest[-1].isspace() else words.pop()
        if not context.token.endswith(token):  # IPython splits at "=", ":" and such
            return nothing
        from freeride_lab.cli.hints import complete, subcommands
        from freeride_lab.core.budget import OverrunPolicy
        from freeride_lab.core.schedule import SCHEDULES
        from freeride_lab.tasks import BUILTIN_TASKS

        parser = self._grammar()
        tasks = [*BUILTIN_TASKS, *_user_task_names(self.tasks_dir)]
        values = {
            "task": tasks,
            "task_id": self._task_ids(),
            "schedule": list(SCHEDULES),
            "policy": [str(p) for p in OverrunPolicy],
        }
        found = complete(
            parser, words, token, values, run_dir_optional=True, is_run_dir=_is_run_dir
        )
        commands = subcommands(parser)

        def kind(text: str) -> str:
            if text.startswith("-"):
                return "option"
            return "task" if text in tasks else "command" if text in commands else "value"

        return {
            "completions": [SimpleCompletion(text, type=kind(text)) for text in found],
            "suppress": bool(found),
            "matched_fragment": token,
        }

    def _task_ids(self) -> list[str]:
        """The current run's side-task ids (for ``tune``/``detach``); none while there is no
        run, or its tasks cannot be read just now."""
        if self._session is None:
            return []
        try:
            return [str(t.get("id")) for t in _tasks(self._session)]
        except (OSError, ValueError, RuntimeError, LookupError):
            return []

    def _grammar(self) -> argparse.ArgumentParser:
        """The notebook's parser, built once per instance (completion runs on every Tab)."""
        if self._parser_cache is None:
            self._parser_cache = _parser()
        return self._parser_cache

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> int:
        """Stop every dashboard pump; returns how many were running."""
        from freeride_lab.ui.dashboard import stop_all

        return stop_all()


def _config_changes(current: Session, new: Any, *, run_dir: str | None) -> str:
    """``"steps: 20 → 30, …"``: what a launch asks for that the live run ``current`` differs in.

    ``run_dir`` and ``master_port`` count only when given, ``extra`` (filled in by the session,
    and not settable from the command line) never.
    """
    old, fresh = current.config.to_dict(), new.to_dict()
    changes = [
        f"{k}: {old.get(k)!r} → {v!r}"
        for k, v in fresh.items()
        if k not in ("run_dir", "master_port", "extra") and old.get(k) != v
    ]
    if new.master_port is not None and new.master_port != current.config.master_port:
        changes.append(f"master_port: {current.config.master_port} → {new.master_port}")
    if run_dir is not None and Path(run_dir).expanduser().absolute() != current.run_dir.path:
        changes.append(f"run_dir: {str(current.run_dir.path)!r} → {run_dir!r}")
    return ", ".join(changes)


def _tasks(session: Any) -> list[dict[str, Any]]:
    tasks = getattr(session, "tasks", None)
    if tasks is None:
        return []
    return [dict(t) for t in (tasks() if callable(tasks) else tasks)]


def _with_hint(message: str, suggestion: str) -> str:
    """``message`` with its "did you mean" (if any) at the end, still one line."""
    return f"{message}; {suggestion}" if suggestion else message


def _user_task_names(tasks_dir: Path) -> list[str]:
    """Names of the ``%%freeride_task`` tasks in ``tasks_dir`` (one ``NAME.json`` each), read
    without importing the dashboard (Tab must answer at once)."""
    with contextlib.suppress(OSError):
        return sorted(p.stem for p in tasks_dir.glob("*.json") if p.with_suffix(".py").is_file())
    return []


def _report_link(path: Path) -> Any:
    """A link to the report, relative to the kernel's directory when it lies below it (the
    notebook's file browser serves paths relative to the notebook)."""
    from IPython.display import FileLink

    try:
        shown = path.absolute().relative_to(Path.cwd())
    except ValueError:
        shown = path.absolute()
    return FileLink(str(shown), result_html_prefix="report: ")  # type: ignore[no-untyped-call]


def _num(value: Any) -> str:
    return f"{value:g}" if isinstance(value, int | float) else str(value)


def _forget_module(path: Path) -> None:
    """Drop modules loaded from ``path`` so a re-run cell is imported afresh."""
    for key, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file is not None and Path(file).absolute() == path:
            del sys.modules[key]


def _cell_failure(name: str, exc: BaseException) -> str:
    """One line on why running a ``%%freeride_task`` cell failed."""
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return f"{name}: running the cell failed: {detail}; the task was not registered"


def _the_task_class(name: str, path: Path) -> type[SideTaskBase]:
    """Import ``path`` once, on its own, and return its one side-task class."""
    from freeride_lab.sidetasks.api import ImperativeSideTask, IterativeSideTask

    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    module_name = f"freeride_cell_{name.replace('-', '_')}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"{name}: {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # sys.exit(), KeyboardInterrupt, RecursionError: the kernel lives
        raise UsageError(_cell_failure(name, exc)) from None
    bases = (IterativeSideTask, ImperativeSideTask)
    found = [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, bases)
        and value not in bases
        and value.__module__ == module_name
    ]
    if len(found) != 1:
        names = ", ".join(c.__name__ for c in found) or "none"
        raise UsageError(
            f"{name}: the cell must define exactly one IterativeSideTask or ImperativeSideTask "
            f"subclass (from freeride_lab import IterativeSideTask); it defines {names}"
        )
    return found[0]


# -- the extension hooks (called from freeride_lab/__init__.py) ----------------------------------


def load(ipython: InteractiveShell) -> FreerideMagics:
    """Register the magics and the notebook's view of a Session (imports no torch, starts no
    thread or process)."""
    from freeride_lab.ui.display import register_display

    FreerideMagics.freeride.__doc__ = _help_text()
    magics = FreerideMagics(ipython)
    ipython.register_magics(magics)
    register_display(ipython)
    completer = getattr(ipython, "Completer", None)
    if completer is not None:
        _drop_matchers(completer)
        completer.custom_matchers.append(_matcher(magics))
    return magics


def _matcher(magics: FreerideMagics) -> Callable[[CompletionContext], SimpleMatcherResult]:
    """``magics.complete`` marked as an IPython matcher of API v2."""
    from IPython.core.completer import context_matcher

    @context_matcher()  # type: ignore[untyped-decorator]
    def freeride_matcher(context: CompletionContext) -> SimpleMatcherResult:
        return magics.complete(context)

    freeride_matcher.matcher_identifier = _MATCHER_ID
    return freeride_matcher


_MATCHER_ID = "freeride_lab.magics.complete"


def _drop_matchers(completer: Any) -> None:
    completer.custom_matchers[:] = [
        m
        for m in completer.custom_matchers
        if getattr(m, "matcher_identifier", None) != _MATCHER_ID
    ]


def unload(ipython: InteractiveShell) -> None:
    """Remove the magics and the Session view, and stop every dashboard pump (runs keep
    going; `session` stays)."""
    from freeride_lab.ui.display import unregister_display

    unregister_display(ipython)
    manager = ipython.magics_manager
    magics = manager.registry.pop(FreerideMagics.__name__, None)
    if isinstance(magics, FreerideMagics):
        magics.close()
    else:
        from freeride_lab.ui.dashboard import stop_all

        stop_all()
    manager.magics["line"].pop("freeride", None)
    manager.magics["cell"].pop("freeride_task", None)
    completer = getattr(ipython, "Completer", None)
    if completer is not None:
        _drop_matchers(completer)
