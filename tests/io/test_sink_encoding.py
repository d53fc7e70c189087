"""``EventSink`` turns events into JSON on its writer thread: an event JSON cannot carry never
reaches the emitting (training) thread as an exception; it is dropped and counted, and the
events around it are written in order."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from waits import wait_until

from freeride_lab.core.events import ControlAck, StepTimed
from freeride_lab.io.sink import EventSink


def step(n: int) -> StepTimed:
    return StepTimed(rank=0, step=n, start_ns=1, end_ns=2, optimizer_start_ns=2, optimizer_end_ns=3)


def test_an_event_json_cannot_carry_is_dropped_and_counted_and_the_others_are_written(
    tmp_path: Path,
) -> None:
    sink = EventSink(tmp_path / "rank-0.jsonl")
    bad = ControlAck(command="attach", t_ns=1, ok=True, payload={"x": object()})
    assert sink.emit(step(0))
    sink.emit(bad)  # never raises into the caller
    assert sink.emit(step(1))
    sink.close()
    lines = [json.loads(x) for x in (tmp_path / "rank-0.jsonl").read_text().splitlines()]
    assert [(x["kind"], x["step"]) for x in lines] == [("step", 0), ("step", 1)]
    assert sink.dropped == 1
    assert sink.encode_errors == 1


def test_events_are_encoded_on_the_writer_thread_not_the_emitting_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import freeride_lab.io.sink as sink_module

    threads: list[str] = []
    real = sink_module.to_json

    def spy(event: object) -> str:
        threads.append(threading.current_thread().name)
        return real(event)  # type: ignore[arg-type]

    monkeypatch.setattr(sink_module, "to_json", spy)
    sink = EventSink(tmp_path / "rank-0.jsonl")
    for n in range(50):
        sink.emit(step(n))
    caller = threading.current_thread().name
    assert caller not in threads  # nothing encoded while the caller emitted
    sink.close()
    assert len(threads) == 50
    lines = (tmp_path / "rank-0.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == list(range(50))


def test_a_failed_write_keeps_only_the_backlog_size_of_what_one_drain_handed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events are emitted faster than the writer wakes, so a thousand reach it at once; the
    write fails (a full disk): the backlog keeps the oldest whole lines within its size and the
    rest are counted as dropped, and once writes work again the kept lines are written."""
    sink = EventSink(tmp_path / "rank-0.jsonl", backlog_bytes=4096, retry_s=0.05)
    failing = threading.Event()
    failing.set()
    write_all = sink._write_all

    def full_disk(payload: bytes) -> None:
        if failing.is_set():
            raise OSError(28, "No space left on device")
        write_all(payload)

    monkeypatch.setattr(sink, "_write_all", full_disk)
    for n in range(1000):
        sink.emit(step(n))
    sink.flush()
    wait_until(lambda: sink.dropped > 0, timeout_s=10, what="events beyond the backlog dropped")
    assert 0 < sink.unwritten < 1000
    failing.clear()
    wait_until(lambda: sink.unwritten == 0, timeout_s=10, what="the backlog written")
    sink.close()
    steps = [json.loads(x)["step"] for x in (tmp_path / "rank-0.jsonl").read_text().splitlines()]
    assert steps == list(range(len(steps))) and len(steps) + sink.dropped == 1000
    assert len((tmp_path / "rank-0.jsonl").read_bytes()) <= 4096
