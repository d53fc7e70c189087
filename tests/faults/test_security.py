"""Control-channel security, tested as an attacker with raw sockets.

Two listeners carry a run's control and telemetry: the event bus (``io/bus.py``, ranks and
workers → the session) and each side-task worker's control channel (``sidetasks/worker.py``, the
session → the worker). Both use ``multiprocessing.connection`` with the run's secret: the server
sends a random challenge and accepts the peer only if it answers with the HMAC of that challenge
under the secret, and only then answers the peer's own challenge; after that, messages are JSON
bytes (``recv_bytes``), never ``recv()``, which would unpickle.

Wire format of one frame (what ``send_bytes`` writes): a 4-byte big-endian length, then the
payload. The attacker here speaks it by hand.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import pickle
import socket
import stat
import struct
import threading
import time
from collections.abc import Iterator
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any

import psutil
import pytest
from waits import wait_until

from freeride_lab.core.config import RunConfig
from freeride_lab.io.bus import BusPublisher, BusServer, encode_batch
from freeride_lab.io.rundir import RunDir
from freeride_lab.sidetasks.client import WorkerClient, WorkerProcess, start_worker

CHALLENGE, WELCOME, FAILURE = b"#CHALLENGE#", b"#WELCOME#", b"#FAILURE#"
HANDSHAKE_TIMEOUT_S = 2.0


# -- the attacker's tools ------------------------------------------------------------------------


def frame(payload: bytes) -> bytes:
    return struct.pack("!i", len(payload)) + payload


def read_frame(sock: socket.socket, timeout_s: float = 10.0) -> bytes | None:
    """One frame from ``sock``; None when the server closed the connection."""
    sock.settimeout(timeout_s)
    header = _read_exactly(sock, 4)
    if header is None:
        return None
    (size,) = struct.unpack("!i", header)
    return _read_exactly(sock, size)


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


def closed_by_peer(sock: socket.socket, timeout_s: float = 10.0) -> bool:
    """True once the server has closed the connection (EOF or reset)."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


class Recorder:
    """A TCP relay between one legitimate client and a server that keeps the client's bytes."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address: tuple[str, int] = self.listener.getsockname()[:2]
        self.client_bytes = bytearray()
        self.done = threading.Event()
        threading.Thread(target=self._relay, daemon=True).start()

    def _relay(self) -> None:
        client, _ = self.listener.accept()
        server = socket.create_connection(self.target)
        pumps = [
            threading.Thread(target=self._pump, args=(client, server, self.client_bytes)),
            threading.Thread(target=self._pump, args=(server, client, None)),
        ]
        for p in pumps:
            p.start()
        for p in pumps:
            p.join()
        client.close()
        server.close()
        self.done.set()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, record: bytearray | None) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if record is not None:
                    record.extend(data)
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()


class Evil:
    """Creates ``path`` when unpickled: proof that a server unpickled peer data."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


@pytest.fixture
def evil_pickle(tmp_path: Path) -> tuple[bytes, Path]:
    marker = tmp_path / "unpickled-by-the-server"
    return pickle.dumps(Evil(marker)), marker


@pytest.fixture
def pickle_spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every unpickling in this process (the bus server runs in it)."""
    import multiprocessing.connection as mpc

    calls: list[str] = []
    real_loads = pickle.loads

    def spy(data: bytes, *args: Any, **kwargs: Any) -> Any:
        calls.append(threading.current_thread().name)
        return real_loads(data, *args, **kwargs)

    monkeypatch.setattr(pickle, "loads", spy)
    monkeypatch.setattr(mpc._ForkingPickler, "loads", spy)  # what Connection.recv() calls
    return calls


# -- the bus ------------------------------------------------------------------------------------

SECRET = os.urandom(32)


@pytest.fixture
def bus(caplog: pytest.LogCaptureFixture) -> Iterator[BusServer]:
    caplog.set_level(logging.WARNING, logger="freeride_lab.io.bus")
    server = BusServer(SECRET, handshake_timeout_s=HANDSHAKE_TIMEOUT_S).start()
    yield server
    server.stop()


def logged(caplog: pytest.LogCaptureFixture, *parts: str) -> None:
    """Wait for a log record holding every part (the server counts a refusal, then logs it)."""
    wait_until(
        lambda: any(all(p in r.getMessage() for p in parts) for r in caplog.records),
        timeout_s=10,
        what=f"a log line with {parts}",
    )


def challenge_from(sock: socket.socket) -> bytes:
    message = read_frame(sock)
    assert message is not None and message.startswith(CHALLENGE), message
    return message[len(CHALLENGE) :]


def non_loopback_ipv4() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return str(a.address)
    return None


def listening_ips(pid: int, port: int) -> set[str]:
    return {
        c.laddr.ip
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


def test_run_config_binds_the_bus_to_loopback_unless_asked() -> None:
    assert RunConfig().bus_host == "127.0.0.1"
    with BusServer(SECRET) as server:
        assert server.address[0] == "127.0.0.1"


def test_bus_listens_on_loopback_only(bus: BusServer) -> None:
    _, port = bus.address
    assert listening_ips(os.getpid(), port) == {"127.0.0.1"}
    outside = non_loopback_ipv4()
    if outside is None:
        pytest.skip("this host has no non-loopback IPv4 address to try")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((outside, port), timeout=5).close()


def test_bus_refuses_a_peer_without_the_secret_and_logs_it(
    bus: BusServer, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.create_connection(bus.address) as raw:
        challenge_from(raw)
        raw.sendall(frame(os.urandom(16)))  # a guess at the digest
        assert read_frame(raw) == FAILURE
        assert closed_by_peer(raw)
    wait_until(lambda: bus.refused == 1, timeout_s=10, what="the refusal")
    logged(caplog, "refused peer", "digest received was wrong")
    assert bus.received == 0


def test_bus_refuses_a_peer_with_a_wrong_secret_and_logs_it(
    bus: BusServer, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.create_connection(bus.address) as raw:
        nonce = challenge_from(raw)
        raw.sendall(frame(hmac.new(os.urandom(32), nonce, "md5").digest()))
        assert read_frame(raw) == FAILURE
    wait_until(lambda: bus.refused == 1, timeout_s=10, what="the refusal")
    logged(caplog, "refused peer")
    with pytest.raises(AuthenticationError):  # the library client, same verdict
        Client(bus.address, authkey=b"x" * 32)
    wait_until(lambda: bus.refused == 2, timeout_s=10, what="the second refusal")


def test_bus_refuses_a_replayed_session_and_delivers_nothing_from_it(
    bus: BusServer, caplog: pytest.LogCaptureFixture
) -> None:
    relay = Recorder(bus.address)
    publisher = BusPublisher(relay.address, SECRET, source="rank-0.jsonl")
    publisher.publish(0, b'{"kind":"step","step":0}\n')
    wait_until(lambda: bus.received == 1, timeout_s=30, what="the legitimate batch")
    publisher.close()
    relay.done.wait(10)
    captured = bytes(relay.client_bytes)
    assert encode_batch("rank-0.jsonl", 0, b'{"kind":"step","step":0}\n') in captured

    with socket.create_connection(bus.address) as raw:
        challenge_from(raw)
        raw.sendall(captured)  # the old answer to an old challenge, then the old batch
        assert read_frame(raw) == FAILURE
        assert closed_by_peer(raw)
    wait_until(lambda: bus.refused == 1, timeout_s=10, what="the refusal of the replay")
    logged(caplog, "refused peer")
    assert bus.received == 1 and len(bus.batches) == 1
    relay.close()


def test_bus_answers_no_challenge_before_the_peer_proved_the_secret(bus: BusServer) -> None:
    """Otherwise an attacker could ask the server to compute digests for it (an HMAC oracle)."""
    with socket.create_connection(bus.address) as raw:
        challenge_from(raw)
        raw.sendall(frame(CHALLENGE + os.urandom(20)))  # a challenge where a digest belongs
        assert read_frame(raw) == FAILURE
        assert closed_by_peer(raw)


def test_bus_never_unpickles_before_authentication(
    bus: BusServer, evil_pickle: tuple[bytes, Path], pickle_spy: list[str]
) -> None:
    payload, marker = evil_pickle
    with socket.create_connection(bus.address) as raw:
        challenge_from(raw)
        raw.sendall(frame(payload) * 3)  # where the digest belongs, and after it
        assert read_frame(raw) == FAILURE
    wait_until(lambda: bus.refused == 1, timeout_s=10, what="the refusal")
    with socket.create_connection(bus.address) as raw:  # no handshake at all
        raw.sendall(frame(payload))
        assert closed_by_peer(raw, timeout_s=HANDSHAKE_TIMEOUT_S + 10)
    wait_until(lambda: bus.refused == 2, timeout_s=10, what="the second refusal")
    assert not marker.exists()
    assert pickle_spy == []


def test_bus_never_unpickles_even_an_authenticated_peer(
    bus: BusServer,
    evil_pickle: tuple[bytes, Path],
    pickle_spy: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    payload, marker = evil_pickle
    with Client(bus.address, authkey=SECRET) as conn:
        conn.send_bytes(payload)
        conn.send(Evil(marker))  # what a pickling client would send
        wait_until(lambda: caplog.text.count("malformed message") >= 2, timeout_s=10, what="logs")
    assert not marker.exists()
    assert pickle_spy == []
    assert bus.received == 0


def test_bus_cuts_off_a_silent_peer_at_the_handshake_deadline(
    bus: BusServer, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.create_connection(bus.address) as raw:
        challenge_from(raw)
        started = time.monotonic()
        assert closed_by_peer(raw, timeout_s=HANDSHAKE_TIMEOUT_S + 10)  # never answers
        assert time.monotonic() - started < HANDSHAKE_TIMEOUT_S + 10
    wait_until(lambda: bus.refused == 1, timeout_s=10, what="the refusal")
    logged(caplog, "refused peer")


# -- the run directory ---------------------------------------------------------------------------


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def test_run_dir_is_private_and_its_secret_owner_only_even_under_umask_0(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    with umask(0):
        run.create()
    assert stat.S_IMODE(run.path.stat().st_mode) == 0o700
    assert stat.S_IMODE(run.secret_file.stat().st_mode) == 0o600
    assert len(run.secret()) == 32


def test_an_existing_shared_run_dir_is_refused_not_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "run"
    path.mkdir(mode=0o777)
    os.chmod(path, 0o777)
    with pytest.raises(PermissionError, match="0700"):
        RunDir(path).create()
    assert stat.S_IMODE(path.stat().st_mode) == 0o777 and not any(path.iterdir())


def test_every_run_gets_its_own_secret(tmp_path: Path) -> None:
    a, b = RunDir(tmp_path / "a"), RunDir(tmp_path / "b")
    a.create()
    b.create()
    assert a.secret() != b.secret()


# -- the worker's control channel ----------------------------------------------------------------


def start(run_dir: RunDir, rank: int) -> tuple[WorkerProcess, WorkerClient]:
    worker = start_worker(run_dir.path, rank)
    return worker, worker.client(timeout_s=60)


@pytest.fixture
def worker(run_dir: RunDir) -> Iterator[tuple[WorkerProcess, WorkerClient]]:
    process, client = start(run_dir, 0)
    yield process, client
    process.stop()


def worker_log(run_dir: RunDir, rank: int = 0) -> str:
    path = run_dir.logs_dir / f"worker-{rank}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def acks(run_dir: RunDir, rank: int = 0) -> list[dict[str, Any]]:
    path = run_dir.worker_events(rank)
    lines = path.read_text().splitlines() if path.exists() else []
    return [e for e in map(json.loads, lines) if e["kind"] == "control_ack"]


def test_worker_listens_on_loopback_only(worker: tuple[WorkerProcess, WorkerClient]) -> None:
    process, client = worker
    assert process.popen is not None
    host, port = client.address
    assert host == "127.0.0.1"
    assert listening_ips(process.popen.pid, port) == {"127.0.0.1"}


def test_worker_refuses_a_peer_without_the_secret_and_logs_it(
    run_dir: RunDir, worker: tuple[WorkerProcess, WorkerClient]
) -> None:
    _, client = worker
    with socket.create_connection(client.address) as raw:
        nonce = challenge_from(raw)
        raw.sendall(frame(hmac.new(b"not the secret", nonce, "md5").digest()))
        assert read_frame(raw) == FAILURE
        assert closed_by_peer(raw)
    wait_until(
        lambda: "refused a control connection" in worker_log(run_dir),
        timeout_s=10,
        what="the worker's refusal in its log",
    )
    assert client.status().ok  # the worker goes on serving its rightful owner


def test_worker_refuses_a_replayed_stop_command(
    run_dir: RunDir, worker: tuple[WorkerProcess, WorkerClient]
) -> None:
    """A ``stop`` captured on the wire stops its worker; replayed at the next one, it does not."""
    first, client = worker
    relay = Recorder(client.address)
    assert WorkerClient(relay.address, run_dir.secret()).stop().ok
    relay.done.wait(10)
    captured = bytes(relay.client_bytes)
    assert b'"cmd": "stop"' in captured
    assert first.popen is not None and first.popen.wait(30) == 0

    second, second_client = start(run_dir, 1)  # same run, same secret
    try:
        before = len(acks(run_dir, 1))
        with socket.create_connection(second_client.address) as raw:
            challenge_from(raw)
            raw.sendall(captured)
            assert read_frame(raw) == FAILURE
            assert closed_by_peer(raw)
        wait_until(
            lambda: "refused a control connection" in worker_log(run_dir, 1),
            timeout_s=10,
            what="the refusal of the replay in the worker's log",
        )
        assert second.running
        assert len(acks(run_dir, 1)) == before  # the replayed command was never carried out
        assert second_client.status().ok
    finally:
        second.stop()


def test_worker_answers_no_challenge_before_the_peer_proved_the_secret(
    worker: tuple[WorkerProcess, WorkerClient],
) -> None:
    _, client = worker
    with socket.create_connection(client.address) as raw:
        challenge_from(raw)
        raw.sendall(frame(CHALLENGE + os.urandom(20)))
        assert read_frame(raw) == FAILURE
        assert closed_by_peer(raw)


def test_worker_never_unpickles_before_or_after_authentication(
    run_dir: RunDir,
    worker: tuple[WorkerProcess, WorkerClient],
    evil_pickle: tuple[bytes, Path],
) -> None:
    _, client = worker
    payload, marker = evil_pickle
    with socket.create_connection(client.address) as raw:
        challenge_from(raw)
        raw.sendall(frame(payload) * 3)
        assert read_frame(raw) == FAILURE
    with Client(client.address, authkey=run_dir.secret()) as conn:
        conn.send_bytes(payload)
        assert conn.poll(30)
        reply = json.loads(conn.recv_bytes())
    assert reply["kind"] == "control_ack" and not reply["ok"]
    assert "not JSON" in reply["message"]
    assert not marker.exists()
    assert client.status().ok
