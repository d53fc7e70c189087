"""The server side of the HMAC handshake of a run's authenticated channels (worker control,
the keeper's request channel), with a deadline so a silent peer stalls nobody.

    refusal = authenticate(conn, secret, timeout_s=5.0)
    if refusal: log.warning("refused a connection: %s", refusal)

    accept_authenticated(listener, secret, serve, stopping=closed.is_set, name="my-channel",
                         timeout_s=5.0, on_refusal=lambda why: log.warning("refused: %s", why))

The challenge goes both ways (``multiprocessing.connection``'s ``deliver_challenge`` then
``answer_challenge``), so the server answers nothing before the peer proved the secret.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener, answer_challenge, deliver_challenge

__all__ = ["accept_authenticated", "authenticate", "shutdown_socket"]


def accept_authenticated(
    listener: Listener,
    secret: bytes,
    serve: Callable[[Connection], None],
    *,
    stopping: Callable[[], bool],
    name: str,
    timeout_s: float,
    on_refusal: Callable[[str], None],
) -> None:
    """Accept connections on ``listener`` until it is closed or ``stopping()``; each one gets a
    daemon thread ``name`` that runs the handshake (``authenticate``), then ``serve(conn)`` for
    a peer that proved ``secret`` or ``on_refusal(why)`` for one that did not, and closes it.

    One thread per connection: a peer that is slow to prove itself holds up no other."""
    while not stopping():
        try:
            conn = listener.accept()
        except OSError:
            return  # closed
        threading.Thread(
            target=_serve_authenticated,
            args=(conn, secret, serve, timeout_s, on_refusal),
            name=name,
            daemon=True,
        ).start()


def _serve_authenticated(
    conn: Connection,
    secret: bytes,
    serve: Callable[[Connection], None],
    timeout_s: float,
    on_refusal: Callable[[str], None],
) -> None:
    try:
        refusal = authenticate(conn, secret, timeout_s=timeout_s)
        if refusal is not None:
            on_refusal(refusal)
            return
        serve(conn)
    finally:
        conn.close()


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
