"""What the dashboard reads from a session, and the board's controller that drives it."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from freeride_lab.lab.task_commands import SideTaskCommands
from freeride_lab.ui.session_view import SessionView

__all__ = ["DashboardSession", "SessionController"]


class DashboardSession(SideTaskCommands, SessionView, Protocol):
    """The part of ``freeride_lab.lab.session.Session`` the dashboard reads and drives (its
    side-task commands: ``lab.task_commands``)."""

    bubble_min_ms: float

    @property
    def state(self) -> Any: ...  # RunState: a str enum with ``.done``
    @property
    def steps_done(self) -> int: ...
    @property
    def tasks(self) -> list[dict[str, Any]]: ...
    def stage_info(self) -> list[dict[str, Any]]: ...


class SessionController:
    """Adapts a session's side-task API to the board's ``TaskController`` protocol.

    Board limits ``memory_bytes``/``sm_pct``/``priority``/``budget_ms`` become ``memory``/
    ``sm_pct``/``priority``/``budget_ms``; palette names of user tasks become their file
    references. Any refusal reaches the board as ``ValueError`` (shown on the card).
    """

    def __init__(
        self,
        session: DashboardSession,
        *,
        resolve: Callable[[str], str] | None = None,
    ) -> None:
        self._session = weakref.ref(session)
        self.resolve = resolve or (lambda name: name)

    def __repr__(self) -> str:
        session = self._session()
        return f"<SessionController run_id={getattr(session, 'run_id', None)!r}>"

    @property
    def session(self) -> DashboardSession:
        session = self._session()
        if session is None:
            raise ValueError("the session of this board is gone; display a live session again")
        return session

    def attach(self, name: str, stage: int, **limits: Any) -> Mapping[str, Any]:
        priority = limits.get("priority")
        task: Mapping[str, Any] = _refused(
            self.session.attach,
            self.resolve(name),
            stage=stage,
            memory=limits.get("memory_bytes"),
            sm_pct=limits.get("sm_pct"),
            priority=1 if priority is None else int(priority),
            budget_ms=limits.get("budget_ms"),
        )
        return task

    def move(self, task_id: str, stage: int) -> Mapping[str, Any] | None:
        task: Mapping[str, Any] | None = _refused(self.session.move, task_id, stage)
        return task

    def detach(self, task_id: str) -> Mapping[str, Any] | None:
        task: Mapping[str, Any] | None = _refused(self.session.detach, task_id)
        return task

    def checkpoint(self, task_id: str) -> Mapping[str, Any] | None:
        task: Mapping[str, Any] | None = _refused(self.session.checkpoint, task_id)
        return task

    def tune(self, task_id: str, **limits: Any) -> Mapping[str, Any] | None:
        given = {
            "memory": limits.get("memory_bytes"),
            "sm_pct": limits.get("sm_pct"),
            "priority": limits.get("priority"),
            "budget_ms": limits.get("budget_ms"),
        }
        changed = {k: v for k, v in given.items() if v is not None}
        task: Mapping[str, Any] | None = _refused(self.session.tune, task_id, **changed)
        return task


def _refused(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``call(...)``, with a session's refusal (any of its documented errors) as ValueError."""
    try:
        return call(*args, **kwargs)
    except (RuntimeError, LookupError, PermissionError) as exc:  # PermissionError: an observer
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise ValueError(str(message)) from exc
