"""Any message, from an authenticated peer too, is refused without harm.

Both channels of a side-task worker check every frame before using it
(``freeride_lab/sidetasks/messages.py``): the control channel (a client holding the run's
secret) and the task channel (a task process, whose user code can write to it). A bad frame
gets an error reply or is dropped with a log line; the worker goes on serving, and a normal
command works within 2 s after it.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterator
from multiprocessing.connection import Client, Connection
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from freeride_lab.core.sidetask_state import SideTaskState
from freeride_lab.io.rundir import RunDir
from freeride_lab.sidetasks.client import WorkerClient, WorkerProcess, start_worker
from freeride_lab.sidetasks.messages import (
    MAX_FRAME_BYTES,
    MessageError,
    decode_command,
    decode_host_message,
)
from freeride_lab.sidetasks.process import TaskProcess, worker_end
from freeride_lab.sidetasks.spec import TaskSpec

PAGERANK = "freeride_lab.tasks.graph:PageRankTask"

FAST = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
COMMANDS = st.sampled_from(["attach", "tune", "detach", "resume", "status", "stop", "x", 1, None])
COMMAND_LIKE = st.dictionaries(
    st.sampled_from(["spec", "task_id", "reason", "budget_s", "memory_bytes", "x"]),
    JSON,
    max_size=3,
).flatmap(lambda d: COMMANDS.map(lambda c: {**d, "cmd": c}))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WorkerProcess, RunDir]]:
    run = RunDir(tmp_path_factory.mktemp("messages") / "run")
    run.create()
    process = start_worker(run.path, 0)
    process.client(timeout_s=60)
    yield process, run
    process.stop()


def still_serving(process: WorkerProcess, run: RunDir) -> None:
    """The worker is alive and answers a normal command within 2 s."""
    assert process.popen is not None and process.popen.poll() is None, "the worker died"
    client = process.client(timeout_s=10)
    started = time.monotonic()
    ack = WorkerClient(client.address, run.secret(), timeout_s=2.0).status()
    assert ack.ok and time.monotonic() - started < 2.0


def authenticated(process: WorkerProcess, run: RunDir) -> Connection:
    return Client(process.client(timeout_s=10).address, authkey=run.secret())


def reply(conn: Connection) -> dict[str, Any]:
    assert conn.poll(30), "no reply"
    answer: dict[str, Any] = json.loads(conn.recv_bytes())
    return answer


# -- the control channel -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"[1, 2]",
        b'"stop"',
        b"null",
        b'{"cmd": ["attach"]}',
        b'{"cmd": "attach", "spec": [1]}',
        b'{"cmd": "detach", "task_id": {"a": 1}}',
        b'{"cmd": "tune", "task_id": 7}',
        b"[" * 100_000 + b"]" * 100_000,
        b"\xff\xfe junk",
    ],
    ids=["list", "string", "null", "cmd-list", "spec-list", "id-dict", "id-int", "deep", "bytes"],
)
def test_a_bad_command_gets_an_error_reply_and_the_worker_goes_on(
    served: tuple[WorkerProcess, RunDir], raw: bytes
) -> None:
    process, run = served
    with authenticated(process, run) as conn:
        conn.send_bytes(raw)
        answer = reply(conn)
        assert answer["ok"] is False and answer["message"]
        conn.send_bytes(b'{"cmd": "status"}')  # the same connection goes on too
        assert reply(conn)["ok"] is True
    still_serving(process, run)


def test_a_frame_over_the_cap_closes_only_its_connection(
    served: tuple[WorkerProcess, RunDir],
) -> None:
    process, run = served
    with authenticated(process, run) as conn:
        sock = socket.socket(fileno=conn.fileno())
        try:
            sock.sendall(struct.pack("!i", 64 << 20))  # a 64 MiB header, then nothing
            sock.settimeout(10)
            assert sock.recv(1) == b"", "the worker kept a connection it cannot read"
        finally:
            sock.detach()
    still_serving(process, run)


@FAST
@given(message=st.one_of(COMMAND_LIKE, JSON))
def test_any_json_after_authentication_is_answered_and_the_worker_goes_on(
    served: tuple[WorkerProcess, RunDir], message: Any
) -> None:
    process, run = served
    if isinstance(message, dict) and message.get("cmd") in ("stop", "attach"):
        message["cmd"] = "status?"  # a valid stop or attach would do what it says
    with authenticated(process, run) as conn:
        conn.send_bytes(json.dumps(message).encode())
        assert "ok" in reply(conn)
    still_serving(process, run)


@FAST
@given(raw=st.binary(max_size=256))
def test_any_bytes_after_authentication_are_answered_and_the_worker_goes_on(
    served: tuple[WorkerProcess, RunDir], raw: bytes
) -> None:
    process, run = served
    try:
        command = decode_command(raw)
    except MessageError:
        command = None
    if command is not None and command.cmd in ("stop", "attach"):
        raw = b"{}"
    with authenticated(process, run) as conn:
        conn.send_bytes(raw)
        assert "ok" in reply(conn)
    still_serving(process, run)


# -- the task channel ----------------------------------------------------------------------------


@pytest.fixture
def channel() -> Iterator[tuple[TaskProcess, socket.socket]]:
    """A TaskProcess handle whose channel's other end is ours, as a task's code would see it."""
    ours, theirs = socket.socketpair()
    handle = TaskProcess(TaskSpec(task=PAGERANK, task_id="t-junk"))
    handle.conn = worker_end(ours)
    yield handle, theirs
    handle.close_channel()
    theirs.close()


def send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(struct.pack("!i", len(payload)) + payload)


def test_a_task_that_floods_acks_leaves_its_worker_only_the_latest(
    channel: tuple[TaskProcess, socket.socket],
) -> None:
    """Acks nobody asked for (a task's code writing to its channel, or the acks of plain
    sends) are kept only up to a bound: the worker's memory does not follow the flood."""
    handle, theirs = channel
    for i in range(1_000):
        send_frame(theirs, b'{"type": "ack", "cmd": "activate", "ok": true, "message": "%d"}' % i)
        assert handle.receive() is not None
    assert 0 < len(handle._acks) <= 64
    assert handle._acks[-1]["message"] == "999"


@pytest.mark.parametrize(
    "raw",
    [
        b"[1]",
        b"{}",
        b'{"type": "state", "state": "NOT-A-STATE", "accepted": true}',
        b'{"type": "state", "state": "RUNNING", "accepted": "yes"}',
        b'{"type": "ack"}',
        b"[" * 100_000,
        b"\x00\x01",
    ],
)
def test_a_bad_task_message_is_dropped_and_the_channel_goes_on(
    channel: tuple[TaskProcess, socket.socket], raw: bytes
) -> None:
    handle, theirs = channel
    send_frame(theirs, raw)
    assert handle.receive() is None and handle.conn is not None
    send_frame(theirs, b'{"type": "state", "state": "PAUSED", "accepted": true, "mode": "x"}')
    assert handle.receive() is not None and handle.state is SideTaskState.PAUSED


def test_a_huge_length_header_on_the_task_channel_neither_allocates_nor_hangs(
    channel: tuple[TaskProcess, socket.socket],
) -> None:
    handle, theirs = channel
    theirs.sendall(struct.pack("!i", 64 << 20))
    assert handle.receive() is None
    assert handle.conn is None  # the stream is lost: the worker ends the task as gone


def test_a_frame_cut_short_on_the_task_channel_does_not_block_the_worker(
    channel: tuple[TaskProcess, socket.socket],
) -> None:
    handle, theirs = channel
    theirs.sendall(struct.pack("!i", 1000) + b"{")  # promises 1000 bytes, sends one
    started = time.monotonic()
    assert handle.receive() is None
    assert time.monotonic() - started < 10.0
    assert handle.conn is None


@FAST
@given(raw=st.binary(max_size=256) | JSON.map(lambda v: json.dumps(v).encode()))
def test_any_frame_on_the_task_channel_is_read_or_dropped(raw: bytes) -> None:
    ours, theirs = socket.socketpair()
    handle = TaskProcess(TaskSpec(task=PAGERANK, task_id="t-any"))
    handle.conn = worker_end(ours)
    try:
        send_frame(theirs, raw)
        got = handle.receive()
        try:
            decode_host_message(raw)
            assert got is not None
        except MessageError:
            assert got is None
        assert handle.conn is not None
    finally:
        handle.close_channel()
        theirs.close()


def test_frames_are_capped_before_they_are_read() -> None:
    with pytest.raises(MessageError, match="at most"):
        decode_command(b" " * (MAX_FRAME_BYTES + 1))
