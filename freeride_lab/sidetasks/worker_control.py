"""The worker's control channel: a listener, its handshake, and one reply to every request.

Each client connection is served in a thread of its own: it authenticates the peer, decodes
each request, hands it to the worker's loop and sends back the ``ControlAck`` the loop puts in
the request's reply queue (or a refusal when none comes in time). The server counts the replies
it still owes, so that a stopping worker can let the acks it already gave reach their clients
before it exits.

# [Note: worker control]
A ``multiprocessing.connection`` listener on 127.0.0.1 (a free port), authenticated with the
run's secret (HMAC challenge both ways, run in the connection's own thread so a silent peer
stalls nobody), JSON bytes only (``send_bytes``/``recv_bytes``; nothing is unpickled). Its
address is in ``<run_dir>/workers/worker-<r>.json`` once it listens (``WorkerClient`` reads it).
Each request ``{"cmd": ...}`` gets exactly one reply, a ``ControlAck`` as JSON:

- ``attach {"spec": TaskSpec.to_dict()}``: queue a task (payload: task_id, position, pid);
- ``tune {"task_id", <GpuLimits fields>, "overrun_policy"}``: a budget or policy change reaches
  the running process; a memory, SM-share or priority change (read only when CUDA starts)
  checkpoints the task and restarts its process transparently (payload: restarted, fields);
- ``detach {"task_id"}``: checkpoint, STOPPED, removed; ``resume {"task_id"}``: after an overrun
  PAUSE; ``checkpoint {"task_id"}``: save its state now (payload: path); ``status``: tasks and
  their states; ``stop``: detach every task, then exit.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection, Listener
from typing import Any

from freeride_lab.core import events as ev
from freeride_lab.io.handshake import accept_authenticated
from freeride_lab.sidetasks.messages import (
    MAX_FRAME_BYTES,
    MessageError,
    command_dict,
    decode_command,
)

log = logging.getLogger("freeride_lab.sidetasks.worker")

__all__ = ["ControlServer", "Reply"]

_HANDSHAKE_TIMEOUT_S = 5.0
_REPLY_TIMEOUT_S = 120.0

Reply = queue.Queue[ev.ControlAck]


class ControlServer:
    """Accepts authenticated control connections on 127.0.0.1 (a free port) for one worker.

    Args:
        secret: the run's secret, for the handshake.
        submit: hands a request and its reply queue to the worker's loop.
        ack: makes a ``ControlAck(command, ok, message)`` (the refusal of a malformed request,
            or of one the loop did not answer in time).
        stopping: True once the worker stops; no connection is accepted after that.
    """

    def __init__(
        self,
        secret: bytes,
        *,
        submit: Callable[[dict[str, Any], Reply], None],
        ack: Callable[[str, bool, str], ev.ControlAck],
        stopping: Callable[[], bool],
    ) -> None:
        self._secret = secret
        self._submit = submit
        self._ack = ack
        self._stopping = stopping
        self._replying = threading.Condition()
        self._replies_owed = 0  # requests taken from clients whose ack is not sent yet
        self._listener: Listener | None = None

    def start(self) -> tuple[str, int]:
        """Listen and accept in a daemon thread; the (host, port) clients connect to."""
        self._listener = Listener(("127.0.0.1", 0))
        threading.Thread(target=self._accept_loop, name="worker-accept", daemon=True).start()
        host, port = self._listener.address
        return str(host), int(port)

    def flush(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the clients' threads to send the acks already given."""
        with self._replying:
            self._replying.wait_for(lambda: self._replies_owed == 0, timeout=timeout_s)

    def close(self) -> None:
        """Stop listening. Idempotent."""
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        accept_authenticated(
            listener,
            self._secret,
            self._serve_client,
            stopping=self._stopping,
            name="worker-client",
            timeout_s=_HANDSHAKE_TIMEOUT_S,
            on_refusal=lambda why: log.warning("worker: refused a control connection: %s", why),
        )

    def _serve_client(self, conn: Connection) -> None:
        """Answer an authenticated client's commands until it hangs up."""
        while True:
            try:
                raw = conn.recv_bytes(MAX_FRAME_BYTES)
            except EOFError:
                return
            except OSError as exc:  # a frame over the cap is not read: the stream is lost
                log.warning("worker: closed a control connection: %s", exc)
                return
            try:
                message = command_dict(decode_command(raw))
            except MessageError as exc:
                log.warning("worker: refused a command: %s", exc)
                conn.send_bytes(ev.to_json(self._ack("?", False, str(exc))).encode())
                continue
            self._answer(conn, message)

    def _answer(self, conn: Connection, message: dict[str, Any]) -> None:
        """Send the loop's ack to ``message``, or a refusal after ``_REPLY_TIMEOUT_S``."""
        reply: Reply = queue.Queue(maxsize=1)
        with self._replying:
            self._replies_owed += 1
        try:
            self._submit(message, reply)
            try:
                ack = reply.get(timeout=_REPLY_TIMEOUT_S)
            except queue.Empty:
                ack = self._ack(str(message.get("cmd")), False, "worker busy: no reply in time")
            conn.send_bytes(ev.to_json(ack).encode())
        finally:
            with self._replying:
                self._replies_owed -= 1
                self._replying.notify_all()
