"""Beacons and heartbeat files: what one side writes, the other reads, and torn records."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from freeride_lab.sidetasks.heartbeat import (
    BeaconPhase,
    TaskBeacon,
    WorkerHeartbeat,
    heartbeat_path,
    read_heartbeat,
)


def test_a_mark_made_through_one_mapping_is_read_through_another() -> None:
    worker_side = TaskBeacon.create()
    host_side = TaskBeacon.attach(os.dup(worker_side.fd))  # as the task process maps it
    try:
        host_side.step_started(12, budget_ns=50_000_000)
        reading = worker_side.read()
        assert reading is not None
        assert (reading.phase, reading.step, reading.budget_ns) == (
            BeaconPhase.STEP,
            12,
            50_000_000,
        )
        host_side.waiting(0.5)
        reading = worker_side.read()
        assert reading is not None
        assert (reading.phase, reading.period_ns) == (BeaconPhase.WAITING, 500_000_000)
    finally:
        host_side.close()
        worker_side.close()


def test_a_write_left_half_done_reads_as_the_mark_before_it() -> None:
    beacon = TaskBeacon.create()
    try:
        beacon.step_started(7, budget_ns=1)
        before = beacon.read()
        struct.pack_into("<Q", beacon._map, 0, 1001)  # odd: a writer stopped mid-write
        assert beacon.read() == before
    finally:
        beacon.close()


def test_a_heartbeat_file_holds_the_pid_the_period_and_a_growing_count(tmp_path: Path) -> None:
    path = heartbeat_path(tmp_path, 3)
    heartbeat = WorkerHeartbeat(path, period_s=0.5)
    first = read_heartbeat(path)
    heartbeat.beat()
    second = read_heartbeat(path)
    assert first is not None and second is not None
    assert (second.pid, second.period_ns) == (os.getpid(), 500_000_000)
    assert second.count == first.count + 1 and second.beat_ns >= first.beat_ns
    heartbeat.close(remove=True)
    assert read_heartbeat(path) is None


def test_a_corrupt_heartbeat_file_reads_as_none(tmp_path: Path) -> None:
    path = heartbeat_path(tmp_path, 0)
    WorkerHeartbeat(path, period_s=0.5).close()
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF
    path.write_bytes(bytes(data))
    assert read_heartbeat(path) is None
