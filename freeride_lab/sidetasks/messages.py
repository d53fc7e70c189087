"""The shapes of the messages that cross a side-task worker's two channels, checked before use.

    command = decode_command(raw)        # worker control channel: one of Attach, Tune, ...
    message = decode_host_message(raw)   # task channel, host → worker: a checked dict

Both channels authenticate their peer (the control channel with the run's secret; the task
channel is a socketpair the worker made), but an authenticated peer can still send anything:
a buggy client, a task's own code writing to the inherited descriptor. So every frame is
bounded before it is read (``MAX_FRAME_BYTES``), decoded without deep recursion, and validated
against one pydantic model per message type; what fails raises ``MessageError`` (a
``ValueError``) whose text says what was wrong, and the caller answers or drops it and goes on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from freeride_lab.core.sidetask_state import SideTaskState

__all__ = [
    "COMMANDS",
    "MAX_DEPTH",
    "MAX_FRAME_BYTES",
    "Attach",
    "Checkpoint",
    "Command",
    "Detach",
    "MessageError",
    "Resume",
    "Status",
    "Stop",
    "Tune",
    "command_dict",
    "decode_command",
    "decode_host_message",
]

MAX_FRAME_BYTES = 1 << 20  # a TaskSpec or a state message is a few KiB
MAX_DEPTH = 32  # nesting of arrays/objects; json.loads recurses once per level
_MAX_ID = 200


class MessageError(ValueError):
    """A frame that is not a valid message; its text names the problem."""


def _check(name: str, value: object, kind: type | tuple[type, ...]) -> None:
    """``value`` is one of ``kind`` (a bool is no int unless ``kind`` names bool)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise MessageError(f"{name} must be {names}, not {type(value).__name__}")


def _task_id(value: object) -> None:
    _check("task_id", value, str)
    assert isinstance(value, str)
    if not 0 < len(value) <= _MAX_ID:
        raise MessageError(f"task_id must have 1 to {_MAX_ID} characters, not {len(value)}")


@dataclass(frozen=True)
class Attach:
    """Queue a task; ``spec`` is ``TaskSpec.to_dict()`` (``TaskSpec.from_dict`` checks it)."""

    spec: dict[str, Any]
    cmd: ClassVar[str] = "attach"

    def __post_init__(self) -> None:
        _check("spec", self.spec, dict)


@dataclass(frozen=True)
class Tune:
    """New limits for a task; ``settings`` are ``GpuLimits`` fields and ``overrun_policy``,
    whose names and values the worker checks against ``GpuLimits``."""

    task_id: str
    settings: dict[str, Any] = field(default_factory=dict)
    cmd: ClassVar[str] = "tune"

    def __post_init__(self) -> None:
        _task_id(self.task_id)
        for name, value in self.settings.items():
            _check(name, value, (int, float, str, bool, type(None)))


@dataclass(frozen=True)
class Detach:
    task_id: str
    reason: str = "detached"
    cmd: ClassVar[str] = "detach"

    def __post_init__(self) -> None:
        _task_id(self.task_id)
        _check("reason", self.reason, str)
        if len(self.reason) > 500:
            raise MessageError("reason must have at most 500 characters")


@dataclass(frozen=True)
class Resume:
    task_id: str
    cmd: ClassVar[str] = "resume"

    def __post_init__(self) -> None:
        _task_id(self.task_id)


@dataclass(frozen=True)
class Checkpoint:
    task_id: str
    cmd: ClassVar[str] = "checkpoint"

    def __post_init__(self) -> None:
        _task_id(self.task_id)


@dataclass(frozen=True)
class Status:
    cmd: ClassVar[str] = "status"


@dataclass(frozen=True)
class Stop:
    cmd: ClassVar[str] = "stop"


Command = Attach | Tune | Detach | Resume | Checkpoint | Status | Stop
_BY_NAME: dict[str, type[Command]] = {
    c.cmd: c for c in (Attach, Tune, Detach, Resume, Checkpoint, Status, Stop)
}
COMMANDS = tuple(_BY_NAME)


def _load(raw: bytes) -> Any:
    if len(raw) > MAX_FRAME_BYTES:
        raise MessageError(f"frame of {len(raw)} bytes; at most {MAX_FRAME_BYTES}")
    depth = 0
    for byte in raw:  # brackets inside strings count too: a bound, not a parse
        if byte in b"[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise MessageError(f"nested deeper than {MAX_DEPTH} levels")
        elif byte in b"]}":
            depth -= 1
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise MessageError(f"not JSON: {exc}") from None


def _object(raw: bytes, what: str) -> dict[str, Any]:
    data = _load(raw)
    if not isinstance(data, dict):
        raise MessageError(f"{what} is a JSON object, not {type(data).__name__}")
    return data


def decode_command(raw: bytes) -> Command:
    """One control-channel command, checked.

    Raises:
        MessageError: too big, too deep, not JSON, not an object, an unknown ``cmd``, missing
            or unknown fields, or fields of the wrong type; the text says which.
    """
    data = _object(raw, "a command")
    cmd = data.pop("cmd", None)
    kind = _BY_NAME.get(cmd) if isinstance(cmd, str) else None
    if kind is None:
        raise MessageError(f"unknown command {cmd!r}; valid: {', '.join(COMMANDS)}")
    if kind is Tune:
        task_id = data.pop("task_id", None)
        if task_id is None:
            raise MessageError("bad tune command: task_id is missing")
        return Tune(task_id, data)
    names = {f.name for f in fields(kind)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise MessageError(f"bad {cmd} command: unknown field(s) {', '.join(unknown)}")
    try:
        return kind(**data)
    except TypeError as exc:  # a required field is missing
        raise MessageError(f"bad {cmd} command: {exc}") from None


def command_dict(command: Command) -> dict[str, Any]:
    """A checked command as the worker's handlers take it: ``{"cmd": ..., **fields}``."""
    if isinstance(command, Tune):
        return {"cmd": "tune", "task_id": command.task_id, **command.settings}
    return {"cmd": command.cmd, **{f.name: getattr(command, f.name) for f in fields(command)}}


_HOST_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "state": {"state": str, "accepted": bool},
    "ack": {"ok": bool},
    "paused": {},
}


def decode_host_message(raw: bytes) -> dict[str, Any]:
    """One task-host message as a dict, checked against its type (see [Note: host protocol]).

    Raises:
        MessageError: not one of the host protocol's messages, or fields of the wrong type.
    """
    data = _object(raw, "a host message")
    kind = data.get("type")
    required = _HOST_FIELDS.get(kind) if isinstance(kind, str) else None
    if required is None:
        raise MessageError(f"unknown host message type {kind!r}; valid: {', '.join(_HOST_FIELDS)}")
    for name, expected in required.items():
        if name not in data:
            raise MessageError(f"bad {kind} message: {name} is missing")
        _check(name, data[name], expected)
    if kind == "state":
        if data["state"] not in SideTaskState.__members__:
            raise MessageError(f"bad state message: unknown state {data['state']!r}")
        if not isinstance(data.get("mode", ""), str):
            raise MessageError("bad state message: mode must be str")
    return data
