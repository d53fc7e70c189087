"""The owner's request channel: how another process asks the owner of a detached run to attach,
tune, move, checkpoint or detach side tasks.

    server = OwnerServer(session, secret).start()   # in the keeper (the run's owner)
    client = OwnerClient(address, secret, run_id=..., owner_pid=...)   # in any other process
    client.attach("pagerank", stage=1)              # the task dict, or the owner's error again

[Note: one commander per run]
A run takes commands from one process only: the one that launched it (``Session.launch``).
That process's manager places tasks, keeps their records in ``tasks/``, runs the watchdog
and the governor, and serializes requests under one lock; a second commander would race it
(two placements on one stage, two writers of a task record). A ``Session.open`` elsewhere is
read-only: its side-task commands raise ``PermissionError``. A *detached* run
(``freeride-lab launch``) is owned by its keeper process (``lab.keeper``), which has no user
of its own: it serves this channel, and an observer's commands (the CLI's ``attach``,
``tune``, ``detach``, a notebook's ``Session.open(...).attach``) become requests that the
keeper carries out with its owning Session. Stopping a detached run stays a SIGTERM to the
keeper (``Session.stop`` on an observer).

This is a rule of the API, not a wall between users: the channel, like the bus and the
workers' control channels, admits a peer that proves the run's secret, and any process of the
run's user can read the secret in the run directory (mode 0700). It keeps one process in
charge of a run; it does not defend a run against its own user.

Wire: ``multiprocessing.connection`` on 127.0.0.1 (a free port, in run.json as
``"keeper": {"address": [host, port], "pid": ...}``), an HMAC challenge both ways with the
run's secret (in the connection's own thread, cut off after ``HANDSHAKE_TIMEOUT_S``), then one
JSON request ``{"cmd": "attach"|"tune"|"move"|"checkpoint"|"detach", "args": {...}}`` and one
JSON reply ``{"ok": true, "result": {...}}`` or ``{"ok": false, "error": "ValueError",
"message": ...}`` per connection. Nothing is unpickled (``send_bytes``/``recv_bytes`` only).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import threading
from collections.abc import Callable, Mapping
from multiprocessing import AuthenticationError
from multiprocessing.connection import (
    Client,
    Connection,
    Listener,
)
from typing import Any

from freeride_lab.io.handshake import accept_authenticated

log = logging.getLogger(__name__)

__all__ = ["COMMANDS", "OwnerClient", "OwnerServer"]

COMMANDS = ("attach", "tune", "move", "checkpoint", "detach")
HANDSHAKE_TIMEOUT_S = 5.0
REPLY_TIMEOUT_S = 300.0  # an attach may wait up to two minutes for a starting rank's worker
MAX_REQUEST_BYTES = 1 << 20

# Errors that travel back to the caller as themselves; any other becomes RuntimeError.
_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        ValueError,
        TypeError,
        RuntimeError,
        PermissionError,
        TimeoutError,
        LookupError,
        KeyError,
    )
}


class OwnerServer:
    """Serves requests for ``target`` (the owning ``Session``) on a loopback port.

    Args:
        target: has ``attach``, ``tune``, ``move``, ``checkpoint`` and ``detach`` returning a
            task dict; their keyword parameters are the arguments a request may carry.
        secret: the run's secret (``RunDir.secret()``).
    """

    def __init__(self, target: object, secret: bytes) -> None:
        self._target = target
        self._secret = secret
        self._calls: dict[str, tuple[Callable[..., Any], frozenset[str]]] = {
            cmd: (getattr(target, cmd), _parameters(getattr(target, cmd))) for cmd in COMMANDS
        }
        self._listener = Listener(("127.0.0.1", 0))
        host, port = self._listener.address
        self.address: tuple[str, int] = (str(host), int(port))
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._accept_loop, name="freeride-owner-channel", daemon=True
        )

    def start(self) -> OwnerServer:
        """Accept requests in a daemon thread from now on; returns self."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop accepting requests (one being served finishes). Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed.is_set() else "serving"
        return f"<OwnerServer {self.address[0]}:{self.address[1]} {state}>"

    def _accept_loop(self) -> None:
        accept_authenticated(
            self._listener,
            self._secret,
            self._serve,
            stopping=self._closed.is_set,
            name="freeride-owner-request",
            timeout_s=HANDSHAKE_TIMEOUT_S,
            on_refusal=lambda why: log.warning("owner channel: refused a connection: %s", why),
        )

    def _serve(self, conn: Connection) -> None:
        """Answer the one request of an authenticated connection."""
        try:
            raw = conn.recv_bytes(MAX_REQUEST_BYTES)
        except (EOFError, OSError):
            return
        reply = self._handle(raw)
        with contextlib.suppress(OSError):
            conn.send_bytes(json.dumps(reply, default=str).encode())

    def _handle(self, raw: bytes) -> dict[str, Any]:
        """The reply to one request (see the module docstring)."""
        try:
            request = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            return _error(ValueError(f"the request is not JSON ({exc})"))
        cmd = request.get("cmd") if isinstance(request, dict) else None
        args = request.get("args", {}) if isinstance(request, dict) else None
        if cmd not in self._calls:
            return _error(ValueError(f"unknown command {cmd!r}; valid: {', '.join(COMMANDS)}"))
        call, allowed = self._calls[cmd]
        if not isinstance(args, dict) or not set(args) <= allowed:
            given = sorted(args) if isinstance(args, dict) else args
            return _error(
                ValueError(f"{cmd}: arguments {given!r}; valid: {', '.join(sorted(allowed))}")
            )
        try:
            result = call(**args)
        except (ValueError, TypeError, RuntimeError, OSError, LookupError) as exc:
            log.info("owner channel: %s refused: %s", cmd, exc)
            return _error(exc)
        except Exception as exc:  # a request must never take the owner down
            log.exception("owner channel: %s failed", cmd)
            return _error(RuntimeError(f"the run's owner failed: {type(exc).__name__}: {exc}"))
        log.info("owner channel: %s done for another process", cmd)
        return {"ok": True, "result": result}


class OwnerClient:
    """Sends side-task commands to the owner of a detached run; each returns the task dict.

    Raises (every method): what the owner raised (``ValueError``, ``RuntimeError``, …, with its
    message), or ``RuntimeError`` when the owner does not answer.
    """

    def __init__(
        self,
        address: tuple[str, int],
        secret: bytes,
        *,
        run_id: str,
        owner_pid: int | None,
        timeout_s: float = REPLY_TIMEOUT_S,
    ) -> None:
        self.address = (str(address[0]), int(address[1]))
        self._secret = secret
        self.run_id = run_id
        self.owner_pid = owner_pid
        self.timeout_s = timeout_s

    @classmethod
    def of_run(cls, run: Mapping[str, Any], secret: bytes, *, run_id: str) -> OwnerClient:
        """The client of the keeper that run.json (``run``) names.

        Raises:
            RuntimeError: run.json names no keeper address.
        """
        keeper = run.get("keeper")
        address = keeper.get("address") if isinstance(keeper, Mapping) else None
        pid = keeper.get("pid") if isinstance(keeper, Mapping) else None
        if not (
            isinstance(address, list)
            and len(address) == 2
            and isinstance(address[0], str)
            and type(address[1]) is int
        ):
            raise RuntimeError(
                f"run {run_id} is detached but its run.json names no keeper to ask "
                f"(keeper={keeper!r}); commands reach a detached run only through its keeper: "
                "launch it again with `freeride-lab launch`"
            )
        return cls(
            (address[0], address[1]),
            secret,
            run_id=run_id,
            owner_pid=pid if type(pid) is int else None,
        )

    def attach(self, task: str, **options: Any) -> dict[str, Any]:
        return self._request("attach", {"task": task, **options})

    def tune(self, task_id: str, **limits: Any) -> dict[str, Any]:
        return self._request("tune", {"task_id": task_id, **limits})

    def move(self, task_id: str, stage: int) -> dict[str, Any]:
        return self._request("move", {"task_id": task_id, "stage": stage})

    def checkpoint(self, task_id: str) -> dict[str, Any]:
        return self._request("checkpoint", {"task_id": task_id})

    def detach(self, task_id: str) -> dict[str, Any]:
        return self._request("detach", {"task_id": task_id})

    def __repr__(self) -> str:
        return f"<OwnerClient run={self.run_id} {self.address[0]}:{self.address[1]}>"

    def _request(self, cmd: str, args: dict[str, Any]) -> dict[str, Any]:
        try:
            request = json.dumps({"cmd": cmd, "args": args}).encode()
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"{cmd}: every argument must be a JSON value to reach the run's keeper ({exc})"
            ) from None
        try:
            with Client(self.address, authkey=self._secret) as conn:
                conn.send_bytes(request)
                answered = conn.poll(self.timeout_s)
                raw = conn.recv_bytes() if answered else b""
        except (OSError, EOFError, AuthenticationError) as exc:
            raise RuntimeError(
                f"cannot reach the keeper of run {self.run_id} (pid {self.owner_pid}) at "
                f"{self.address[0]}:{self.address[1]} ({type(exc).__name__}: {exc}); is the run "
                "still going? `freeride-lab status RUN_DIR` says"
            ) from None
        if not answered:
            raise TimeoutError(
                f"the keeper of run {self.run_id} did not answer {cmd!r} within "
                f"{self.timeout_s:g} s; it may still carry it out: see `freeride-lab status`"
            )
        try:
            reply = json.loads(raw)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise RuntimeError(f"the keeper of run {self.run_id} sent no JSON object: {raw[:80]!r}")
        if reply.get("ok"):
            result = reply.get("result")
            return result if isinstance(result, dict) else {}
        error = _ERRORS.get(str(reply.get("error")), RuntimeError)
        raise error(str(reply.get("message", "refused")))


def _parameters(method: Callable[..., Any]) -> frozenset[str]:
    """The argument names ``method`` takes by keyword."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(
        name for name, p in inspect.signature(method).parameters.items() if p.kind in kinds
    )


def _error(exc: Exception) -> dict[str, Any]:
    name = type(exc).__name__ if type(exc).__name__ in _ERRORS else "RuntimeError"
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
    return {"ok": False, "error": name, "message": str(text)}
