"""The side-task commands' shape: what ``attach`` and ``tune`` take, and the protocol that a
run's ``Session``, its ``SideTaskManager``, the keeper's ``OwnerClient`` and the dashboard's
session all follow.

``Session.attach`` and ``Session.tune`` spell the arguments out for users (and the owner
channel reads them there); everything else that takes or passes them on names them here, so a
new argument is added in two places: the session's signature and these dicts.

    def attach(self, task: str, **request: Unpack[AttachOptions]) -> dict[str, Any]: ...

Typing only: importing this module loads nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypedDict, Unpack

__all__ = ["AttachOptions", "LimitChanges", "SideTaskCommands", "check_keywords"]


class LimitChanges(TypedDict, total=False):
    """``tune``'s limits (``Session.tune`` documents each); one left out, or None, stays."""

    memory: int | str | None
    sm_pct: float | None
    priority: int | None
    budget_ms: float | None
    trickle_duty: float | None


class AttachOptions(TypedDict, total=False):
    """``attach``'s keyword arguments (``Session.attach`` documents each and its default:
    ``priority`` 1, ``policy`` "KILL", ``gating`` "bubbles", ``placement`` "freeride", the
    others None)."""

    stage: int | None
    memory: int | str | None
    sm_pct: float | None
    priority: int
    budget_ms: float | None
    options: Mapping[str, Any] | None
    policy: str
    gating: str
    placement: str


def check_keywords(command: str, given: Mapping[str, Any], shape: type) -> None:
    """Raise as Python would for a misspelt keyword: ``**request: Unpack[...]`` is only
    checked by a type checker, and a typo must not be dropped silently at run time.

    Raises:
        TypeError: a key of ``given`` is not a field of the TypedDict ``shape``.
    """
    valid = shape.__annotations__
    unknown = [k for k in given if k not in valid]
    if unknown:
        raise TypeError(
            f"{command}() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
            f"valid: {', '.join(valid)}"
        )


class SideTaskCommands(Protocol):
    """The five side-task commands; each returns the task's dict (``Session.tasks``)."""

    def attach(self, task: str, **request: Unpack[AttachOptions]) -> dict[str, Any]: ...
    def tune(self, task_id: str, **limits: Unpack[LimitChanges]) -> dict[str, Any]: ...
    def move(self, task_id: str, stage: int) -> dict[str, Any]: ...
    def checkpoint(self, task_id: str) -> dict[str, Any]: ...
    def detach(self, task_id: str) -> dict[str, Any]: ...
