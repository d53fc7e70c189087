"""The live event bus: authenticated JSON lines from ranks and workers to the session.

The run directory is the source of truth; the bus only makes it live. Each publisher (one per
event file) sends the bytes it has just appended to its file, tagged with the file's name and the
byte offset they start at, so the receiver can merge bus data and file data exactly once
(``freeride_lab.lab.tables.EventTailer.feed``).

    >>> server = BusServer(secret=b"k" * 32).start()          # binds 127.0.0.1:<free port>
    >>> pub = BusPublisher(server.address, b"k" * 32, source="rank-0.jsonl")
    >>> pub.publish(0, b'{"kind":"step"}\\n')                  # never blocks
    True
    >>> pub.close(); server.stop()

Transport: ``multiprocessing.connection`` over TCP with its HMAC challenge in both directions
(a peer without the run's secret is refused and the refusal is logged). Only ``send_bytes`` /
``recv_bytes`` are used — never ``send``/``recv``, which would unpickle peer data.

[Note: bus wire format]
One message = one ``send_bytes`` payload::

    {"v":1,"source":"rank-0.jsonl","offset":1234}\\n      header: one JSON object
    {"kind":"action",...}\\n{"kind":"step",...}\\n          the file's bytes [offset, offset+n)

``source`` is a bare event-file name and ``offset`` the byte offset of the first line in it.

[Note: handshake off the accept thread]
``Listener(authkey=...)`` runs the HMAC challenge inside ``accept()``, so one silent peer would
stall every later connection. The server therefore accepts without a key and runs the same
challenge (``deliver_challenge`` then ``answer_challenge``, what ``accept()`` itself calls) in the
connection's own thread, with a deadline after which the socket is shut down.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import (
    Client,
    Connection,
    Listener,
    answer_challenge,
    deliver_challenge,
)
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["QUEUED_BATCHES", "BusAddress", "BusBatch", "BusPublisher", "BusServer"]

BusAddress = tuple[str, int]
WIRE_VERSION = 1
MAX_MESSAGE_BYTES = 16 << 20
_SOURCE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}\.jsonl$")


@dataclass(frozen=True, slots=True)
class BusBatch:
    """Lines appended to one event file: ``payload`` is the file's bytes from ``offset`` on."""

    source: str  # event-file name, e.g. "rank-0.jsonl"
    offset: int  # byte offset of payload[0] in that file
    payload: bytes  # complete lines, each ending in b"\n"

    @property
    def end(self) -> int:
        """Byte offset just past the payload."""
        return self.offset + len(self.payload)

    def events(self) -> list[dict[str, Any]]:
        """The payload's lines as dicts (lines that are not JSON objects are skipped)."""
        out: list[dict[str, Any]] = []
        for line in self.payload.splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                log.warning(
                    "bus: %s@%d: skipping a line that is not JSON", self.source, self.offset
                )
                continue
            if isinstance(obj, dict):
                out.append(obj)
        return out


def encode_batch(source: str, offset: int, payload: bytes) -> bytes:
    """One wire message (see [Note: bus wire format])."""
    header = json.dumps(
        {"v": WIRE_VERSION, "source": source, "offset": offset}, separators=(",", ":")
    )
    return header.encode() + b"\n" + payload


def decode_batch(message: bytes) -> BusBatch:
    """Parse one wire message; raises ValueError if it is malformed."""
    head, sep, payload = message.partition(b"\n")
    if not sep:
        raise ValueError("bus message without a header line")
    header = json.loads(head)
    if not isinstance(header, dict) or header.get("v") != WIRE_VERSION:
        raise ValueError(f"bus header {head[:80]!r}: expected a JSON object with v={WIRE_VERSION}")
    source, offset = header.get("source"), header.get("offset")
    if not isinstance(source, str) or not _SOURCE_RE.match(source):
        raise ValueError(f"bus source {source!r} is not an event-file name like 'rank-0.jsonl'")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"bus offset {offset!r} must be an integer >= 0")
    if payload and not payload.endswith(b"\n"):
        raise ValueError(f"bus payload from {source}@{offset} does not end with a newline")
    return BusBatch(source, offset, payload)


def _shutdown(conn: Connection) -> None:
    """Wake any thread blocked on ``conn`` by shutting its socket down (fd stays owned by conn)."""
    try:
        sock = socket.socket(fileno=os.dup(conn.fileno()))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


#: Batches a ``BusServer`` without ``on_batch`` keeps for its reader.
QUEUED_BATCHES = 10_000


class BusServer:
    """Receives batches from many publishers; delivers them to ``on_batch`` or ``self.batches``.

    Args:
        secret: the run's secret; peers must prove they hold it (HMAC challenge both ways).
        host, port: where to listen; port 0 picks a free one (see ``address``).
        on_batch: called from a connection thread for every batch; None queues them in
            ``batches`` instead (the newest ``QUEUED_BATCHES``; older ones are dropped and
            counted in ``dropped``). It must be quick and must not raise.
        handshake_timeout_s: a peer that has not authenticated by then is disconnected.
    """

    def __init__(
        self,
        secret: bytes,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        on_batch: Callable[[BusBatch], None] | None = None,
        handshake_timeout_s: float = 10.0,
    ) -> None:
        if not isinstance(secret, bytes) or len(secret) < 16:
            raise ValueError("secret must be at least 16 random bytes (RunDir.secret())")
        self._secret = secret
        self._host = host
        self._port = port
        self._on_batch = on_batch
        self._handshake_timeout_s = handshake_timeout_s
        self.batches: collections.deque[BusBatch] = collections.deque(maxlen=QUEUED_BATCHES)
        self.dropped = 0  # queued batches pushed out unread (no on_batch, nobody reading)
        self.refused = 0  # peers that failed the handshake
        self.received = 0  # batches delivered
        self._listener: Listener | None = None
        self._address: BusAddress | None = None
        self._accept_thread: threading.Thread | None = None
        self._conns: set[Connection] = set()
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._stopping = False

    @property
    def address(self) -> BusAddress:
        """``(host, port)`` clients connect to; only valid after ``start()``."""
        if self._address is None:
            raise RuntimeError("BusServer has no address yet; call start() first")
        return self._address

    @property
    def running(self) -> bool:
        return self._listener is not None and not self._stopping

    def start(self) -> BusServer:
        """Bind and start accepting. Returns self."""
        if self._listener is not None:
            return self
        self._listener = Listener((self._host, self._port), family="AF_INET", backlog=64)
        host, port = self._listener.address[:2]
        self._address = (str(host), int(port))
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"bus-accept:{port}", daemon=True
        )
        self._accept_thread.start()
        log.debug("bus listening on %s:%d", *self._address)
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop accepting, disconnect every peer and join the threads. Idempotent."""
        with self._lock:
            if self._stopping or self._listener is None:
                self._stopping = True
                return
            self._stopping = True
            conns = list(self._conns)
        # accept() is not woken by close() on Linux: connect once so it returns and sees _stopping.
        with contextlib.suppress(OSError):
            socket.create_connection(self.address, timeout=timeout_s).close()
        for conn in conns:
            _shutdown(conn)
        if self._accept_thread is not None:
            self._accept_thread.join(timeout_s)
        self._listener.close()
        deadline = time.monotonic() + timeout_s
        for t in list(self._threads):
            t.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> BusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = f"{self._address[0]}:{self._address[1]}" if self._address else "unbound"
        state = "stopped" if self._stopping else ("running" if self._listener else "new")
        return f"<BusServer {where} {state} peers={len(self._conns)} refused={self.refused}>"

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping:
            try:
                conn = self._listener.accept()
            except OSError:
                if not self._stopping:
                    log.exception("bus: accept failed")
                return
            peer = self._listener.last_accepted
            if self._stopping:
                conn.close()
                return
            t = threading.Thread(
                target=self._serve, args=(conn, peer), name=f"bus-peer:{peer}", daemon=True
            )
            with self._lock:
                self._conns.add(conn)
                self._threads.add(t)
            t.start()

    def _serve(self, conn: Connection, peer: object) -> None:
        timer = threading.Timer(self._handshake_timeout_s, _shutdown, args=(conn,))
        timer.daemon = True
        timer.start()
        try:
            try:
                deliver_challenge(conn, self._secret)
                answer_challenge(conn, self._secret)
            except (AuthenticationError, EOFError, OSError, ValueError) as e:
                self.refused += 1
                log.warning("bus: refused peer %s: %s", peer, e or type(e).__name__)
                return
            finally:
                timer.cancel()
            log.debug("bus: peer %s authenticated", peer)
            self._receive(conn, peer)
        finally:
            conn.close()
            with self._lock:
                self._conns.discard(conn)
                self._threads.discard(threading.current_thread())

    def _receive(self, conn: Connection, peer: object) -> None:
        while not self._stopping:
            try:
                message = conn.recv_bytes(MAX_MESSAGE_BYTES)
            except (EOFError, OSError):
                return
            try:
                batch = decode_batch(message)
            except ValueError as e:
                log.warning("bus: dropping a malformed message from %s: %s", peer, e)
                continue
            self.received += 1
            if self._on_batch is None:
                if len(self.batches) == QUEUED_BATCHES:
                    self.dropped += 1
                self.batches.append(batch)
                continue
            try:
                self._on_batch(batch)
            except Exception:
                log.exception("bus: on_batch failed for %s@%d", batch.source, batch.offset)


class BusPublisher:
    """Sends one event file's new bytes to a ``BusServer``; ``publish`` never blocks.

    A daemon thread (started on the first ``publish``) connects lazily. While the server cannot
    be reached, batches are dropped and counted (``dropped_batches``) and the connection is
    retried with exponential backoff; the file keeps everything, so nothing is lost for good.
    """

    def __init__(
        self,
        address: BusAddress,
        secret: bytes,
        *,
        source: str,
        capacity: int = 1024,
        backoff_s: tuple[float, float] = (0.05, 5.0),
    ) -> None:
        if not _SOURCE_RE.match(source):
            raise ValueError(f"source={source!r} must be an event-file name like 'rank-0.jsonl'")
        self.address: BusAddress = (str(address[0]), int(address[1]))
        self.source = source
        self.capacity = capacity
        self.sent_batches = 0
        self.dropped_batches = 0
        self._secret = secret
        self._backoff_min_s, self._backoff_max_s = backoff_s
        self._backoff_s = self._backoff_min_s
        self._next_attempt = 0.0
        self._queue: collections.deque[bytes] = collections.deque()
        self._wake = threading.Event()
        self._closed = False
        self._conn: Connection | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def connected(self) -> bool:
        return self._conn is not None

    def publish(self, offset: int, payload: bytes) -> bool:
        """Queue ``payload`` (complete lines at byte ``offset`` of the file); False if dropped."""
        if self._closed or len(self._queue) >= self.capacity:
            self.dropped_batches += 1
            return False
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name=f"bus-publisher:{self.source}", daemon=True
                    )
                    self._thread.start()
        self._queue.append(encode_batch(self.source, offset, payload))
        self._wake.set()
        return True

    def close(self, timeout_s: float = 1.0) -> None:
        """Send what is queued (within ``timeout_s``) and disconnect. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        conn = self._conn
        if conn is not None and (self._thread is None or not self._thread.is_alive()):
            conn.close()
            self._conn = None

    def __repr__(self) -> str:
        state = "connected" if self._conn else "disconnected"
        return (
            f"<BusPublisher {self.source} -> {self.address[0]}:{self.address[1]} {state} "
            f"sent={self.sent_batches} dropped={self.dropped_batches}>"
        )

    def _run(self) -> None:
        while True:
            self._wake.wait(0.5)
            self._wake.clear()
            while self._queue:
                if not self._send(self._queue[0]):
                    self.dropped_batches += len(self._queue)
                    self._queue.clear()
                    break
                self._queue.popleft()
                self.sent_batches += 1
            if self._closed and not self._queue:
                return

    def _send(self, message: bytes) -> bool:
        conn = self._conn or self._connect()
        if conn is None:
            return False
        try:
            conn.send_bytes(message)
            return True
        except OSError as e:
            log.debug("bus: lost %s:%d (%s); will reconnect", *self.address, e)
            conn.close()
            self._conn = None
            self._schedule_retry()
            return False

    def _connect(self) -> Connection | None:
        if time.monotonic() < self._next_attempt:
            return None
        try:
            self._conn = Client(self.address, family="AF_INET", authkey=self._secret)
        except (OSError, EOFError, AuthenticationError) as e:
            log.debug(
                "bus: cannot reach %s:%d (%s); retry in %.2f s", *self.address, e, self._backoff_s
            )
            self._schedule_retry()
            return None
        self._backoff_s = self._backoff_min_s
        return self._conn

    def _schedule_retry(self) -> None:
        self._next_attempt = time.monotonic() + self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, self._backoff_max_s)
