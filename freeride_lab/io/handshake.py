"""The server side of the HMAC handshake of a run's authenticated channels (worker control,
the keeper's request channel), with a deadline so a silent peer stalls nobody.

    refusal = authenticate(conn, secret, timeout_s=5.0)
    if refusal: log.warning("refused a connection: %s", refusal)

The challenge goes both ways (``multiprocessing.connection``'s ``deliver_challenge`` then
``answer_challenge``), so the server answers nothing before the peer proved the secret.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

__all__ = ["authenticate", "shutdown_socket"]


def authenticate(conn: Connection, secret: bytes, *, timeout_s: float) -> str | None:
    """Run the handshake on an accepted ``conn``; None if the peer proved ``secret``, else why
    it was refused (a wrong answer, a peer that hung up, or one silent past ``timeout_s``)."""
    timer = threading.Timer(timeout_s, shutdown_socket, args=(conn,))
    timer.daemon = True
    timer.start()
    try:
        deliver_challenge(conn, secret)
        answer_challenge(conn, secret)
    except (AuthenticationError, EOFError, OSError, ValueError) as exc:
        return str(exc) or type(exc).__name__
    finally:
        timer.cancel()
    return None


def shutdown_socket(conn: Connection) -> None:
    """Wake a thread blocked on ``conn`` (a silent peer in the handshake)."""
    try:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
    except OSError:
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
