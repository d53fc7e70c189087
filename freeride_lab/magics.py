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
displays a link to it. One difference (``freeride_lab.cli.notebook`` [Note: the current run]):
where the CLI needs a ``RUN_DIR``, the notebook may leave it out and means the *current*
session — the one ``launch`` started, held by the :class:`FreerideMagics` instance and named
``session`` in the notebook. ``launch`` starts the run
in the kernel (its processes stay in the kernel's process group; the CLI's ``launch`` detaches a
keeper instead), returns at once and displays the live dashboard (``freeride_lab.ui.dashboard``);
running the same launch cell again while that run is live reuses it and says so. Bad input is
one ``UsageError`` line, never a traceback.

``%%freeride_task NAME`` writes its cell to ``./.freeride_tasks/NAME.py`` and registers it as
NAME for ``%freeride attach NAME`` and the board's palette (``freeride_lab.task_cell``).

Loading imports no torch and starts nothing; ``%unload_ext freeride_lab`` removes the magics
and stops every dashboard pump; ``%reload_ext`` does not start a second one.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import math
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from freeride_lab.cli.notebook import (
    REPORT_NAME,
    completions,
    config_changes,
    help_text,
    notebook_parser,
    number,
    task_lines,
    task_ref,
    with_hint,
    with_run_dir,
)

if TYPE_CHECKING:
    from IPython.core.completer import CompletionContext, SimpleMatcherResult
    from IPython.core.interactiveshell import InteractiveShell

    from freeride_lab.lab.session import Session

__all__ = ["FreerideMagics", "load", "unload"]

#: The notebook's reading of the CLI grammar (``freeride_lab.cli.notebook``); tests use it too.
_parser = notebook_parser


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
        (``freeride_lab.cli.notebook`` [Note: the current run])."""
        from freeride_lab.cli.app import UsageError as CliUsageError

        session = self.session
        try:
            return with_run_dir(argv, parser, session.run_dir.path if session else None)
        except CliUsageError as exc:
            raise UsageError(str(exc)) from None

    # -- %freeride -----------------------------------------------------------------------------

    @line_magic
    def freeride(self, line: str) -> None:
        """(replaced by the parser's help when the extension loads)"""
        try:
            argv = shlex.split(line)
        except ValueError as exc:
            raise UsageError(f"cannot split {line!r}: {exc}") from None
        parser = notebook_parser()
        if not argv:
            print(help_text())
            return
        from freeride_lab.cli.app import UsageError as CliUsageError
        from freeride_lab.cli.hints import hint

        typed = argv
        argv = self._with_run_dir(argv, parser)
        try:
            args = parser.parse_args(argv)
        except CliUsageError as exc:
            raise UsageError(with_hint(str(exc), hint(parser, typed))) from None
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
            "checkpoint": self._checkpoint,
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
            differs = config_changes(
                current.config.to_dict(),
                config.to_dict(),
                run_dir=args.run_dir,
                current_run_dir=current.run_dir.path,
            )
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
        for line in task_lines(_tasks(session)):
            print(line)

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
            target = REPORT_NAME.replace("<run_id>", safe_id)
        path = Path(session.report(target))
        print(
            f"report written to {path} (self-contained HTML; Parquet tables, summary.json and "
            f"per-rank Chrome traces beside it in {path.parent})"
        )
        display(_report_link(path))  # type: ignore[no-untyped-call]

    # side tasks ----------------------------------------------------------------------------------

    def _attach(self, args: argparse.Namespace) -> None:
        from freeride_lab.cli.runs import _options

        session = self._current(args)
        task = session.attach(
            task_ref(args.task, self.tasks_dir, [str(t.get("id")) for t in _tasks(session)]),
            stage=args.stage,
            memory=args.memory,
            sm_pct=args.sm,
            priority=1 if args.priority is None else args.priority,
            budget_ms=args.budget_ms,
            options=_options(args.option) or None,
            policy=args.policy,
            gating=args.gating,
            placement=args.placement,
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

    def _checkpoint(self, args: argparse.Namespace) -> None:
        session = self._current(args)
        task = session.checkpoint(args.task_id)
        print(f"saved the state of {task['id']} ({task['name']}) at {_done(task)}; it goes on")

    def _detach(self, args: argparse.Namespace) -> None:
        session = self._current(args)
        task = session.detach(args.task_id)
        print(
            f"detached {task['id']} ({task['name']}) after {_done(task)}; "
            f"`%freeride attach {task['id']}` resumes it"
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
        from freeride_lab.task_cell import save_task_cell

        try:
            name, cls, path = save_task_cell(line, cell, self.tasks_dir)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
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

        found, token = completions(
            context.text_until_cursor,
            context.token,
            self._grammar(),
            self.tasks_dir,
            self._task_ids(),
        )
        if not found:
            return {"completions": [], "suppress": False}
        return {
            "completions": [SimpleCompletion(text, type=kind) for text, kind in found],
            "suppress": True,
            "matched_fragment": token,
        }

    def _task_ids(self) -> list[str]:
        """The current run's side-task ids (for ``tune``, ``checkpoint``, ``detach``); none while
        there is no run, or its tasks cannot be read just now."""
        if self._session is None:
            return []
        try:
            return [str(t.get("id")) for t in _tasks(self._session)]
        except (OSError, ValueError, RuntimeError, LookupError):
            return []

    def _grammar(self) -> argparse.ArgumentParser:
        """The notebook's parser, built once per instance (completion runs on every Tab)."""
        if self._parser_cache is None:
            self._parser_cache = notebook_parser()
        return self._parser_cache

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> int:
        """Stop every dashboard pump; returns how many were running."""
        from freeride_lab.ui.dashboard import stop_all

        return stop_all()


def _done(task: dict[str, Any]) -> str:
    """How much of its work a task dict says is done: "120 samples"."""
    return f"{number(task.get('progress'))} {task.get('unit') or ''}"


def _tasks(session: Any) -> list[dict[str, Any]]:
    tasks = getattr(session, "tasks", None)
    if tasks is None:
        return []
    return [dict(t) for t in (tasks() if callable(tasks) else tasks)]


def _report_link(path: Path) -> Any:
    """A link to the report, relative to the kernel's directory when it lies below it (the
    notebook's file browser serves paths relative to the notebook)."""
    from IPython.display import FileLink

    try:
        shown = path.absolute().relative_to(Path.cwd())
    except ValueError:
        shown = path.absolute()
    return FileLink(str(shown), result_html_prefix="report: ")  # type: ignore[no-untyped-call]


# -- the extension hooks (called from freeride_lab/__init__.py) ----------------------------------


def load(ipython: InteractiveShell) -> FreerideMagics:
    """Register the magics and the notebook's view of a Session (imports no torch, starts no
    thread or process)."""
    from freeride_lab.ui.display import register_display

    FreerideMagics.freeride.__doc__ = help_text()
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
