"""Claims about the live event bus: authentication, delivery, and a publisher that never blocks."""

from __future__ import annotations

import logging
import re
import socket
import struct
from collections.abc import Iterator
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client
from pathlib import Path

import pytest
from waits import wait_until

from freeride_lab.core.events import ActionTimed
from freeride_lab.io.bus import BusPublisher, BusServer, decode_batch, encode_batch
from freeride_lab.io.sink import EventSink
from freeride_lab.pipeline.launcher import free_port

SECRET = b"s" * 32
WRONG = b"w" * 32


@pytest.fixture
def server() -> Iterator[BusServer]:
    srv = BusServer(SECRET).start()
    yield srv
    srv.stop()


def line(i: int) -> bytes:
    return b'{"kind":"step","i":%d}\n' % i


def test_client_with_wrong_secret_is_refused_and_logged(
    server: BusServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="freeride_lab.io.bus")
    with pytest.raises(AuthenticationError):
        Client(server.address, authkey=WRONG)
    wait_until(lambda: server.refused == 1, timeout_s=10, what="the refusal")
    wait_until(lambda: "refused peer" in caplog.text, timeout_s=10, what="the refusal log line")


def test_unauthenticated_peer_data_is_never_delivered(server: BusServer) -> None:
    message = encode_batch("rank-0.jsonl", 0, line(0))
    with socket.create_connection(server.address) as raw:
        raw.sendall(struct.pack("!i", len(message)) + message)  # skips the handshake
        wait_until(lambda: server.refused == 1, timeout_s=10, what="the refusal")
    assert server.received == 0
    assert list(server.batches) == []


def test_authenticated_publisher_batches_arrive_in_order(server: BusServer) -> None:
    pub = BusPublisher(server.address, SECRET, source="rank-1.jsonl")
    assert pub.publish(0, line(0))
    assert pub.publish(len(line(0)), line(1))
    wait_until(lambda: len(server.batches) == 2, timeout_s=10, what="two batches")
    pub.close()
    first, second = server.batches
    assert (first.source, first.offset, first.payload) == ("rank-1.jsonl", 0, line(0))
    assert second.offset == first.end
    assert [e["i"] for e in second.events()] == [1]


def test_a_server_nobody_reads_keeps_only_the_newest_batches_and_counts_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from freeride_lab.io import bus

    monkeypatch.setattr(bus, "QUEUED_BATCHES", 3)
    srv = BusServer(SECRET).start()
    try:
        pub = BusPublisher(srv.address, SECRET, source="rank-0.jsonl")
        offset = 0
        for i in range(5):
            assert pub.publish(offset, line(i))
            offset += len(line(i))
        wait_until(lambda: srv.received == 5, timeout_s=10, what="five batches")
        pub.close()
        assert [b.events()[0]["i"] for b in srv.batches] == [2, 3, 4]
        assert srv.dropped == 2
    finally:
        srv.stop()


def test_silent_peer_does_not_hold_up_other_publishers(server: BusServer) -> None:
    with socket.create_connection(server.address):  # connects, never answers the challenge
        pub = BusPublisher(server.address, SECRET, source="rank-0.jsonl")
        pub.publish(0, line(0))
        wait_until(lambda: len(server.batches) == 1, timeout_s=10, what="the publisher's batch")
        pub.close()


def test_publisher_survives_an_absent_server_and_connects_once_it_is_up() -> None:
    port = free_port()
    pub = BusPublisher(("127.0.0.1", port), SECRET, source="rank-0.jsonl", backoff_s=(0.01, 0.1))
    assert pub.publish(0, line(0))  # queued even though nobody listens
    wait_until(lambda: pub.dropped_batches >= 1, timeout_s=10, what="the batch to be dropped")
    srv = BusServer(SECRET, port=port).start()
    try:
        offset = len(line(0))

        def delivered() -> bool:
            pub.publish(offset, line(1))  # re-offer until the retry has connected
            return len(srv.batches) > 0

        wait_until(delivered, timeout_s=10, what="a batch after the server came up")
    finally:
        pub.close()
        srv.stop()
    assert srv.batches[0].payload == line(1)


def test_event_sink_forwards_exactly_the_bytes_it_writes(server: BusServer, tmp_path: Path) -> None:
    sink = EventSink(tmp_path / "rank-0.jsonl", bus=(server.address, SECRET))
    for i in range(3):
        sink.emit(
            ActionTimed(rank=0, stage=0, step=0, action="F", microbatch=i, start_ns=i, end_ns=i)
        )
        sink.flush()
    sink.close()
    data = (tmp_path / "rank-0.jsonl").read_bytes()
    wait_until(
        lambda: sum(len(b.payload) for b in server.batches) == len(data),
        timeout_s=10,
        what="every written byte on the bus",
    )
    batches = sorted(server.batches, key=lambda b: b.offset)
    assert b"".join(b.payload for b in batches) == data
    assert [b.offset for b in batches] == [0, *[b.end for b in batches[:-1]]]


def test_decode_rejects_a_source_that_is_not_an_event_file_name() -> None:
    with pytest.raises(ValueError, match=re.escape("'../run.json'")):
        decode_batch(b'{"v":1,"source":"../run.json","offset":0}\n')


def test_server_stop_is_idempotent(server: BusServer) -> None:
    server.stop()
    server.stop()
    assert not server.running
