"""How other processes reach a side-task worker: start it beside a rank, and command it.

    worker = start_worker(run_dir, rank=0)         # edge file + worker process (returns at once)
    worker.bubble_start(step, slot, t_ns, end_ns)  # the rank's hot path: shared memory only
    ack = worker.client().attach("resnet18", limits={"memory_bytes": "4GiB"})
    worker.stop()                                  # CLOSED edge -> tasks checkpoint and stop

    client = WorkerClient.from_run_dir(run_dir, rank=0)   # from anywhere with the run directory
    client.tune(ack.payload["task_id"], sm_pct=50)        # -> ControlAck

rank.py uses ``open_edges`` as its ``edges_factory``. The control protocol is described in
``worker_control`` ([Note: worker control]).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any

from freeride_lab.core import events as ev
from freeride_lab.io.rundir import RunDir, open_append
from freeride_lab.sidetasks.edges import EdgeWriter, edge_path
from freeride_lab.sidetasks.process import child_env
from freeride_lab.sidetasks.spec import TaskSpec
from freeride_lab.sidetasks.worker_exit import clear_exit, exit_reason, record_exit

log = logging.getLogger(__name__)

__all__ = ["WorkerClient", "WorkerProcess", "open_edges", "start_worker", "worker_address_file"]

_REPLY_TIMEOUT_S = 120.0
_STOP_GRACE_S = 20.0


def worker_address_file(run_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where the worker of ``rank`` publishes its control address."""
    return Path(run_dir) / "workers" / f"worker-{rank}.json"


# --- client -------------------------------------------------------------------------------


class WorkerClient:
    """Sends commands to one worker; every method returns the worker's ``ControlAck``.

    A refused command comes back as an ack with ``ok=False`` and the reason in ``message``.

    Raises (every method):
        TimeoutError: no reply within ``timeout_s``.
        ConnectionError: the worker is not listening (it exited or never started).
        multiprocessing.AuthenticationError: the secret is wrong.
    """

    def __init__(
        self, address: tuple[str, int], secret: bytes, *, timeout_s: float = _REPLY_TIMEOUT_S
    ) -> None:
        self.address = (str(address[0]), int(address[1]))
        self._secret = secret
        self.timeout_s = timeout_s

    @classmethod
    def from_run_dir(
        cls,
        run_dir: str | os.PathLike[str],
        rank: int,
        *,
        timeout_s: float = 30.0,
        secret: bytes | None = None,
    ) -> WorkerClient:
        """The client of the worker of ``rank``, waiting up to ``timeout_s`` for it to listen.

        Args:
            secret: the run's secret as this process read it once; None reads it now.

        Raises:
            TimeoutError: no worker address appeared in time.
        """
        path = worker_address_file(run_dir, rank)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                info = json.loads(path.read_text())
                break
            except (FileNotFoundError, ValueError):
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"no worker for rank {rank} in {str(run_dir)!r} after {timeout_s} s "
                        f"({str(path)!r} missing); is the rank running with "
                        "runtime.edges_factory='freeride_lab.sidetasks.client:open_edges'?"
                    ) from None
                time.sleep(0.05)
        host, port = info["address"]
        if secret is None:
            secret = RunDir(Path(run_dir)).secret()
        return cls((str(host), int(port)), secret)

    def attach(self, spec: TaskSpec | Mapping[str, Any] | str, **fields: Any) -> ev.ControlAck:
        """Queue a task: a ``TaskSpec``, its dict, or a task reference plus ``TaskSpec`` fields.

        Raises:
            ValueError, TypeError: the spec is invalid (checked here, before sending).
        """
        if isinstance(spec, str):
            spec = TaskSpec.from_dict({"task": spec, **fields})
        elif isinstance(spec, Mapping):
            spec = TaskSpec.from_dict({**spec, **fields})
        elif fields:
            spec = dataclasses.replace(spec, **fields)
        return self._call({"cmd": "attach", "spec": spec.to_dict()})

    def tune(self, task_id: str, **limits: Any) -> ev.ControlAck:
        """Change ``GpuLimits`` fields (and/or ``overrun_policy``) of an attached task."""
        return self._call({"cmd": "tune", "task_id": task_id, **limits})

    def detach(self, task_id: str) -> ev.ControlAck:
        """Checkpoint and stop a task, and remove it from the worker."""
        return self._call({"cmd": "detach", "task_id": task_id})

    def resume(self, task_id: str) -> ev.ControlAck:
        """Let a task paused by its overrun policy take bubbles again."""
        return self._call({"cmd": "resume", "task_id": task_id})

    def checkpoint(self, task_id: str) -> ev.ControlAck:
        """Save a task's state now; the ack's message names the file."""
        return self._call({"cmd": "checkpoint", "task_id": task_id})

    def status(self) -> ev.ControlAck:
        """The worker's tasks and their states (in ``payload``)."""
        return self._call({"cmd": "status"})

    def stop(self) -> ev.ControlAck:
        """Detach every task, then end the worker."""
        return self._call({"cmd": "stop"})

    def _call(self, message: dict[str, Any]) -> ev.ControlAck:
        with Client(self.address, authkey=self._secret) as conn:
            conn.send_bytes(json.dumps(message).encode())
            if not conn.poll(self.timeout_s):
                raise TimeoutError(
                    f"worker at {self.address} did not answer {message['cmd']!r} "
                    f"within {self.timeout_s} s"
                )
            ack = ev.from_json(conn.recv_bytes().decode())
        assert isinstance(ack, ev.ControlAck)
        return ack

    def __repr__(self) -> str:
        return f"<WorkerClient({self.address[0]}:{self.address[1]})>"


# --- starting a worker beside a rank ------------------------------------------------------


class WorkerProcess:
    """A worker process beside a rank, plus the rank's ``EdgeWriter`` that feeds it.

    It is the ``edges`` object of the rank's stage: ``bubble_start``/``bubble_end`` go straight
    to the shared-memory writer (never blocking). ``stop()`` closes the edge file (the worker
    then checkpoints and stops its tasks) and waits for the worker, escalating to SIGTERM and
    SIGKILL. The worker also exits by itself if this process dies. However the worker ends, a
    daemon thread here records how (``worker_exit`` [Note: worker death]).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        rank: int,
        *,
        device: str = "cpu",
        stage: int | None = None,
        clock_offset_ns: int = 0,
        mps_active: bool | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.device = device
        self.stage = rank if stage is None else stage
        self.mps_active = mps_active
        self._clock_offset_ns = clock_offset_ns
        self.edges: EdgeWriter | None = None
        self.popen: subprocess.Popen[bytes] | None = None
        self._stopped = False

    def start(self) -> WorkerProcess:
        """Create the edge file and start the worker (returns at once; see ``client``)."""
        if self.popen is not None:
            return self
        self.edges = EdgeWriter.create(
            edge_path(self.run_dir, self.rank), clock_offset_ns=self._clock_offset_ns
        )
        command = [
            sys.executable, "-m", "freeride_lab.sidetasks.worker",
            "--run-dir", str(self.run_dir), "--rank", str(self.rank),
            "--device", self.device, "--stage", str(self.stage),
            "--parent-pid", str(os.getpid()),
        ]  # fmt: skip
        if self.mps_active is not None:
            command.append("--mps" if self.mps_active else "--no-mps")
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        clear_exit(self.run_dir, self.rank)
        with os.fdopen(open_append(logs / f"worker-{self.rank}.log"), "ab") as out:
            self.popen = subprocess.Popen(
                command, env=child_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        threading.Thread(
            target=self._record_exit, args=(self.popen,), name="worker-exit", daemon=True
        ).start()
        return self

    def _record_exit(self, popen: subprocess.Popen[bytes]) -> None:
        """Wait for the worker and record how it ended (``worker_exit`` [Note: worker death])."""
        returncode = popen.wait()
        if returncode != 0:
            how = exit_reason(returncode)
            log.warning("the worker of rank %d (pid %d) died: %s", self.rank, popen.pid, how)
        record_exit(self.run_dir, self.rank, pid=popen.pid, returncode=returncode)

    def bubble_start(self, step: int, slot: int, t_ns: int, predicted_end_ns: int | None) -> None:
        """Hot path: publish a bubble start (see ``EdgeWriter.bubble_start``)."""
        if self.edges is not None:
            self.edges.bubble_start(step, slot, t_ns, predicted_end_ns)

    def bubble_end(self, step: int, slot: int, t_ns: int) -> None:
        """Hot path: publish a bubble end (see ``EdgeWriter.bubble_end``)."""
        if self.edges is not None:
            self.edges.bubble_end(step, slot, t_ns)

    def set_clock_offset(self, clock_offset_ns: int) -> None:
        """Share the rank's clock offset (call after its clock sync)."""
        self._clock_offset_ns = clock_offset_ns
        if self.edges is not None:
            self.edges.set_clock_offset(clock_offset_ns)

    def client(self, *, timeout_s: float = 30.0) -> WorkerClient:
        """A ``WorkerClient`` for this worker, once it listens."""
        return WorkerClient.from_run_dir(self.run_dir, self.rank, timeout_s=timeout_s)

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, grace_s: float = _STOP_GRACE_S) -> None:
        """Close the edge file (the worker then stops its tasks and exits); idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self.edges is not None:
            self.edges.close()
        if self.popen is None:
            return
        for action in (None, self.popen.terminate, self.popen.kill):
            if action is not None:
                action()
            try:
                self.popen.wait(grace_s if action is None else 5.0)
                return
            except subprocess.TimeoutExpired:
                continue

    close = stop

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        if self.popen is None:
            state = "new"
        elif self.popen.poll() is None:
            state = f"running pid={self.popen.pid}"
        else:
            state = f"exited {self.popen.returncode}"
        return f"<WorkerProcess(rank={self.rank}, device={self.device!r}, {state})>"


def start_worker(run_dir: str | os.PathLike[str], rank: int, **options: Any) -> WorkerProcess:
    """Create the rank's edge file and start its worker; the started ``WorkerProcess``
    (``options``: its keyword arguments, ``device``, ``stage``, ``clock_offset_ns`` and
    ``mps_active``)."""
    return WorkerProcess(run_dir, rank, **options).start()


def open_edges(*, run_dir: RunDir | str | os.PathLike[str], rank: int) -> WorkerProcess:
    """rank.py's ``edges_factory``: the rank's worker, started, as its stage's ``edges``.

    Reads the device and the rank's lowest stage from run.json (CUDA: ``cuda:$LOCAL_RANK``).
    The rank should call ``close()`` when training ends (CLOSED: the worker checkpoints and
    stops its tasks at once); if it exits without, the worker notices its parent's death and
    does the same.
    """
    path = run_dir.path if isinstance(run_dir, RunDir) else Path(run_dir)
    config = RunDir(path).read_run().get("config", {})
    device = "cpu"
    if config.get("device") == "cuda":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    stage = rank
    try:
        from freeride_lab.core.config import RunConfig
        from freeride_lab.core.schedule import Schedule, stage_indices

        cfg = RunConfig.from_dict(config)
        stages = stage_indices(Schedule.from_name(cfg.schedule), rank, cfg.stages, cfg.chunks or 1)
        stage = min(stages)
    except Exception:
        log.debug("worker: using stage=rank=%d (config not readable as RunConfig)", rank)
    return start_worker(path, rank, device=device, stage=stage)
