"""Claims about the training rank, run as real torchrun jobs of gloo ranks on this machine.

Each module fixture launches one job (or a few at once) and several tests read its events, so
the suite stays short on a small shared CPU box.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import pytest
import torch
from edge_receivers import QUIET_EDGES
from runs import synthetic_config
from waits import wait_until

from freeride_lab.core.config import RunConfig, RuntimeOptions
from freeride_lab.core.schedule import SCHEDULES, torch_plan
from freeride_lab.io.rundir import RunDir

REPO = Path(__file__).resolve().parents[2]
TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
# torch < 2.13 on gloo cannot pass activations between adjacent stages of one rank
# (see rank.py [Note: adjacent stages on one rank]); V schedules always have such a rank.
needs_local_handoff = pytest.mark.skipif(
    TORCH < (2, 13), reason=f"torch {torch.__version__} < 2.13 cannot run V schedules on gloo"
)


def schedule_params(names: list[str]) -> list[Any]:
    return [
        pytest.param(n, marks=needs_local_handoff) if SCHEDULES[n].style == "v" else n
        for n in names
    ]


JOB_TIMEOUT_S = 150
T_MS = 20.0  # synthetic F, I and W cost per micro-batch per rank


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_run(path: Path, cfg: RunConfig) -> RunDir:
    run_dir = RunDir(path)
    run_dir.create()
    run_dir.write_json(run_dir.run_json, {"config": cfg.to_dict(), "run_id": path.name})
    return run_dir


def rank_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", FREERIDE_LOG_LEVEL="WARNING")


def torchrun(
    run_dir: RunDir, nproc: int, *, nnodes: int = 1, node_rank: int = 0, port: int | None = None
) -> subprocess.Popen[bytes]:
    """Start a torchrun job of rank processes; output goes to the run's logs/."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if nnodes == 1:
        cmd += ["--standalone"]
    else:
        cmd += [
            f"--nnodes={nnodes}",
            f"--node-rank={node_rank}",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
        ]
    cmd += ["-m", "freeride_lab.pipeline.rank", "--run-dir", str(run_dir.path)]
    log = open(run_dir.logs_dir / f"torchrun-{node_rank}.log", "wb")  # noqa: SIM115
    return subprocess.Popen(
        cmd, env=rank_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def finish(proc: subprocess.Popen[bytes], timeout_s: float = JOB_TIMEOUT_S) -> int:
    """Wait for a job; on timeout kill its process group (our own job) and fail."""
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"torchrun job {proc.pid} did not finish in {timeout_s} s") from None


def events(run_dir: RunDir) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(run_dir.events_dir.glob("rank-*.jsonl")):
        rank = int(path.stem.split("-")[1])
        out[rank] = [json.loads(line) for line in path.read_text().splitlines() if line]
    return out


def of_kind(evs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in evs if e["kind"] == kind]


def log_tail(run_dir: RunDir) -> str:
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in run_dir.logs_dir.glob("*.log"))


@dataclass
class Job:
    run_dir: RunDir
    config: RunConfig
    returncode: int
    events: dict[int, list[dict[str, Any]]]


def run_job(path: Path, nproc: int, cfg: RunConfig) -> Job:
    run_dir = make_run(path, cfg)
    code = finish(torchrun(run_dir, nproc))
    return Job(run_dir, cfg, code, events(run_dir))


# -- (a) real text, 1F1B, live bubble edges on -------------------------------------------

TEXT_STEPS = 30


@pytest.fixture(scope="module")
def text_job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    config = RunConfig(
        schedule="1F1B",
        stages=2,
        microbatches=4,
        steps=TEXT_STEPS,
        workload="text",
        layers=2,
        d_model=32,
        heads=2,
        seq_len=32,
        microbatch_size=4,
        lr=3e-3,
        seed=0,
        # every gap announced, sub-millisecond ones too, so that each slot can be checked
        runtime=RuntimeOptions(edges_factory=QUIET_EDGES, announce_min_ms=0),
    )
    job = run_job(tmp_path_factory.mktemp("text") / "run", 2, config)
    assert job.returncode == 0, log_tail(job.run_dir)
    return job


def test_text_job_writes_rank_started_first_and_rank_finished_last(text_job: Job) -> None:
    assert sorted(text_job.events) == [0, 1]
    for rank, evs in text_job.events.items():
        assert evs[0]["kind"] == "rank_started", rank
        assert evs[-1]["kind"] == "rank_finished", rank
        assert evs[-1]["steps"] == TEXT_STEPS


def test_text_job_times_every_planned_action_exactly_once_per_step(text_job: Job) -> None:
    plan = torch_plan("1F1B", 2, 4)
    for rank, evs in text_job.events.items():
        expected = Counter(str(a) for a in plan[rank] if a is not None)
        for step in range(TEXT_STEPS):
            seen = Counter(
                f"{e['stage']}{e['action']}{e['microbatch']}"
                for e in of_kind(evs, "action")
                if e["step"] == step
            )
            assert seen == expected, (rank, step)


def test_text_job_loss_goes_down_on_real_text(text_job: Job) -> None:
    losses = [e["loss"] for e in of_kind(text_job.events[1], "step")]
    assert len(losses) == TEXT_STEPS and all(x is not None for x in losses)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.3, f"mean loss of the first 5 steps {first:.3f}, last 5 {last:.3f}"


def test_text_job_reports_memory_and_tokens_every_step(text_job: Job) -> None:
    for evs in text_job.events.values():
        mem = of_kind(evs, "memory")
        assert len(mem) == TEXT_STEPS
        assert all(0 < m["peak_reserved_bytes"] <= m["capacity_bytes"] for m in mem)
        assert {s["tokens"] for s in of_kind(evs, "step")} == {4 * 4 * 32}


def test_text_job_announces_every_gap_of_every_step_with_a_prediction(text_job: Job) -> None:
    for rank, evs in text_job.events.items():
        n_actions = len([e for e in of_kind(evs, "action") if e["step"] == 0])
        edges = of_kind(evs, "bubble_edge")
        for step in range(TEXT_STEPS):
            mine = [(e["edge"], e["slot"]) for e in edges if e["step"] == step]
            # slot k: before action k; slot n_actions: after the last one
            want = [(edge, k) for k in range(n_actions + 1) for edge in ("start", "end")]
            assert mine == want, (rank, step)
        later = [e for e in edges if e["edge"] == "start" and e["step"] > 0]
        assert all(e["predicted_end_ns"] >= e["t_ns"] for e in later), rank
        # slot 0 of a later step opens when the previous step's optimizer is done: the
        # step-boundary wait and the wait for the first input are one bubble
        steps = {e["step"]: e for e in of_kind(evs, "step")}
        for e in (e for e in later if e["slot"] == 0):
            assert steps[e["step"] - 1]["optimizer_end_ns"] <= e["t_ns"], (rank, e)
            assert e["t_ns"] <= steps[e["step"]]["start_ns"], (rank, e)


def test_untimed_steps_record_their_window_but_no_action_and_no_bubble_edge(
    tmp_path: Path,
) -> None:
    """The plain baseline (blocks of untimed steps) runs without the recorder: no action
    events, no bubble edges, yet the step's window, optimizer and loss, like a timed step."""
    config = synthetic_config(
        steps=8,
        microbatches=2,
        phase_ms=2,
        runtime=RuntimeOptions(
            edges_factory=QUIET_EDGES,
            timed="alternate",
            alternate_every=2,
            announce_min_ms=0,  # 2 ms actions: announce every gap, short ones too
        ),
    )
    job = run_job(tmp_path / "run", 2, config)
    assert job.returncode == 0, log_tail(job.run_dir)
    untimed = {2, 3, 6, 7}
    for rank, evs in job.events.items():
        steps = of_kind(evs, "step")
        assert [e["step"] for e in steps] == list(range(8)), rank
        for e in steps:
            marks = [e["start_ns"], e["end_ns"], e["optimizer_start_ns"], e["optimizer_end_ns"]]
            assert marks == sorted(marks), (rank, e)
            assert (e["loss"] is not None) == (rank == 1), (rank, e)
        assert {e["step"] for e in of_kind(evs, "action")} == set(range(8)) - untimed, rank
        # an untimed block's first step only closes the bubble that its timed predecessor
        # opened after its optimizer (slot 0 of the next step: the wait for the first input)
        in_untimed = [
            (e["step"], e["edge"], e["slot"])
            for e in of_kind(evs, "bubble_edge")
            if e["step"] in untimed
        ]
        carried = [(2, "start", 0), (2, "end", 0), (6, "start", 0), (6, "end", 0)]
        assert in_untimed == carried, rank


def test_ranks_predicting_from_their_peers_publish_every_action_and_predict_every_gap(
    tmp_path: Path,
) -> None:
    """Predictor "peers": each rank keeps a board of its action starts in the run's edges/
    (the last step's last backward is on rank 0's at the end), and its bubbles are still
    announced, each with a prediction, once the first step has taught the slots."""
    from freeride_lab.core.schedule import ActionKind
    from freeride_lab.io.peer_board import PeerBoards, peer_board_path

    steps = 6
    config = synthetic_config(
        steps=steps,
        microbatches=4,
        phase_ms=2,
        runtime=RuntimeOptions(edges_factory=QUIET_EDGES, announce_min_ms=0, predictor="peers"),
    )
    job = run_job(tmp_path / "run", 2, config)
    assert job.returncode == 0, log_tail(job.run_dir)
    assert all(peer_board_path(job.run_dir.path, rank).is_file() for rank in (0, 1))
    last = PeerBoards(job.run_dir.path).end_of(0, steps - 1, 0, ActionKind.BACKWARD, 3)
    assert last is not None
    for rank, evs in job.events.items():
        later = [e for e in of_kind(evs, "bubble_edge") if e["edge"] == "start" and e["step"] > 1]
        assert later and all(e["predicted_end_ns"] is not None for e in later), rank


# -- (b) every schedule class on gloo, (e) synthetic timing -------------------------------

SCHEDULE_STEPS = 3


@pytest.fixture(scope="module")
def schedule_jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    """One synthetic 2-rank job per schedule class, all started at once."""
    root = tmp_path_factory.mktemp("schedules")
    started = {}
    for name in SCHEDULES:
        cfg = synthetic_config(steps=SCHEDULE_STEPS, phase_ms=T_MS, schedule=name)
        run_dir = make_run(root / name, cfg)
        started[name] = (run_dir, cfg, torchrun(run_dir, 2))
    return {
        name: Job(run_dir, cfg, finish(proc), events(run_dir))
        for name, (run_dir, cfg, proc) in started.items()
    }


@pytest.mark.parametrize("name", schedule_params(list(SCHEDULES)))
def test_schedule_runs_on_gloo_and_times_torchs_plan_in_order(
    schedule_jobs: dict[str, Job], name: str
) -> None:
    job = schedule_jobs[name]
    assert job.returncode == 0, log_tail(job.run_dir)
    plan = torch_plan(name, 2, 4, job.config.chunks)
    for rank, evs in job.events.items():
        assert evs[-1]["kind"] == "rank_finished", (rank, evs[-1])
        for step in range(SCHEDULE_STEPS):
            seen = [
                f"{e['stage']}{e['action']}{e['microbatch']}"
                for e in of_kind(evs, "action")
                if e["step"] == step
            ]
            assert seen == [str(a) for a in plan[rank] if a is not None], (rank, step)


@pytest.mark.parametrize(
    "name", schedule_params([n for n, s in SCHEDULES.items() if s.splits_backward])
)
def test_zero_bubble_schedules_emit_input_and_weight_backwards(
    schedule_jobs: dict[str, Job], name: str
) -> None:
    kinds = {
        e["action"] for evs in schedule_jobs[name].events.values() for e in of_kind(evs, "action")
    }
    assert {"I", "W"} <= kinds, kinds


def durations_ms(job: Job, action: str, *, skip_stage0: bool = False) -> list[float]:
    return [
        (e["end_ns"] - e["start_ns"]) / 1e6
        for evs in job.events.values()
        for e in of_kind(evs, "action")
        if e["action"] == action and e["step"] > 0 and not (skip_stage0 and e["stage"] == 0)
    ]


def test_synthetic_forward_takes_t_forward(schedule_jobs: dict[str, Job]) -> None:
    got = median(durations_ms(schedule_jobs["1F1B"], "F"))
    assert T_MS * 0.95 <= got <= T_MS + 15, f"median F {got:.1f} ms for t_forward_ms={T_MS}"


def test_synthetic_full_backward_takes_input_plus_weight_time(
    schedule_jobs: dict[str, Job],
) -> None:
    got = median(durations_ms(schedule_jobs["1F1B"], "B"))
    assert 2 * T_MS * 0.95 <= got <= 2 * T_MS + 15, f"median B {got:.1f} ms"


@needs_local_handoff
def test_synthetic_sleeps_land_on_the_input_and_weight_halves(
    schedule_jobs: dict[str, Job],
) -> None:
    # ZBV: two chunks per rank, so each chunk costs T_MS / 2 per action; stage 0's I is a
    # no-op in torch (its W runs the full backward), hence skip_stage0.
    job = schedule_jobs["ZBVZeroBubble"]
    i_ms = median(durations_ms(job, "I", skip_stage0=True))
    w_ms = median(durations_ms(job, "W", skip_stage0=True))
    half = T_MS / 2
    assert half * 0.95 <= i_ms <= half + 10, f"median I {i_ms:.1f} ms, expected ~{half}"
    assert half * 0.95 <= w_ms <= half + 10, f"median W {w_ms:.1f} ms, expected ~{half}"


# -- (c) two "nodes" on localhost ---------------------------------------------------------


def test_two_torchrun_nodes_on_localhost_both_write_events(tmp_path: Path) -> None:
    config = synthetic_config(steps=2, microbatches=2, phase_ms=5, nnodes=2)
    run_dir = make_run(tmp_path / "run", config)
    port = free_port()
    nodes = [torchrun(run_dir, 1, nnodes=2, node_rank=r, port=port) for r in (0, 1)]
    codes = [finish(p) for p in nodes]
    assert codes == [0, 0], log_tail(run_dir)
    evs = events(run_dir)
    assert sorted(evs) == [0, 1]
    for rank, rank_evs in evs.items():
        started = rank_evs[0]
        assert started["kind"] == "rank_started" and started["stages"] == [rank]
        assert started["clock_offset_ns"] == 0  # one host: one clock
        assert rank_evs[-1]["kind"] == "rank_finished"


# -- (d) signals: SIGINT ignored, launcher death stops every rank at one step -------------


@dataclass
class SignalJob:
    job: Job
    steps_at_sigint: int
    steps_at_kill: int


@pytest.fixture(scope="module")
def signal_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SignalJob]:
    cfg = synthetic_config(
        steps=500, microbatches=2, phase_ms=5, runtime=RuntimeOptions(stop_grace_s=20)
    )
    run_dir = make_run(tmp_path_factory.mktemp("signals") / "run", cfg)
    proc = torchrun(run_dir, 2)
    try:

        def steps_done() -> int:
            evs = events(run_dir)
            return min((len(of_kind(evs.get(r, []), "step")) for r in (0, 1)), default=0)

        wait_until(
            lambda: steps_done() >= 2, timeout_s=JOB_TIMEOUT_S, what="two steps on both ranks"
        )
        pids = [of_kind(evs, "rank_started")[0]["pid"] for evs in events(run_dir).values()]
        for pid in pids:
            os.kill(pid, signal.SIGINT)
        at_sigint = steps_done()
        wait_until(lambda: steps_done() >= at_sigint + 5, timeout_s=60, what="5 steps after SIGINT")
        at_kill = steps_done()
        os.kill(proc.pid, signal.SIGKILL)  # the launcher dies; ranks must notice
        proc.wait()
        try:
            wait_until(
                lambda: all(not _alive(p) for p in pids),
                timeout_s=60,
                what=f"rank processes {pids} to exit after their launcher died",
            )
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{_process_states(pids)}\n{log_tail(run_dir)}") from None
        yield SignalJob(Job(run_dir, cfg, proc.returncode, events(run_dir)), at_sigint, at_kill)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _process_states(pids: list[int]) -> str:
    """Where each process is (state and kernel wait channel), for a failure message."""
    lines = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
            wchan = Path(f"/proc/{pid}/wchan").read_text()
            threads = len(list(Path(f"/proc/{pid}/task").iterdir()))
        except OSError:
            lines.append(f"pid {pid}: gone")
            continue
        lines.append(f"pid {pid}: state {state}, wchan {wchan or '-'}, {threads} threads")
    return "\n".join(lines)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (not yet reaped by init) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_sigint_to_ranks_is_ignored_and_training_continues(signal_job: SignalJob) -> None:
    for rank, evs in signal_job.job.events.items():
        assert not of_kind(evs, "rank_failed"), (rank, of_kind(evs, "rank_failed"))
        assert len(of_kind(evs, "step")) >= signal_job.steps_at_sigint + 5


def test_launcher_death_stops_every_rank_gracefully_at_the_same_step(
    signal_job: SignalJob,
) -> None:
    finished = [of_kind(evs, "rank_finished") for evs in signal_job.job.events.values()]
    assert all(len(f) == 1 for f in finished), finished
    steps = {f[0]["steps"] for f in finished}
    assert len(steps) == 1, f"ranks stopped after different step counts {steps}"
    assert signal_job.steps_at_kill <= steps.pop() < signal_job.job.config.steps


# -- GPU ----------------------------------------------------------------------------------


def cuda_text_config(*, steps: int, **changes: Any) -> RunConfig:
    """One rank of the small text model (2 layers, d_model 64) on CUDA, 4 micro-batches a step;
    ``changes`` replace any field."""
    model = {"layers": 2, "d_model": 64, "heads": 4, "seq_len": 64}
    plan = {"schedule": "1F1B", "stages": 1, "microbatches": 4, "steps": steps}
    return RunConfig(workload="text", device="cuda", **{**plan, **model, **changes})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_one_rank_trains_on_cuda_with_event_timing(tmp_path: Path) -> None:
    job = run_job(tmp_path / "run", 1, cuda_text_config(steps=5))
    assert job.returncode == 0, log_tail(job.run_dir)
    evs = job.events[0]
    actions = of_kind(evs, "action")
    assert len(actions) == 5 * 8
    assert all(a["end_ns"] > a["start_ns"] for a in actions)
    steps = of_kind(evs, "step")
    for s in steps:  # every action lies inside its step's window
        inside = [a for a in actions if a["step"] == s["step"]]
        assert all(s["start_ns"] <= a["start_ns"] and a["end_ns"] <= s["end_ns"] for a in inside)
    assert of_kind(evs, "memory")[-1]["device"].startswith("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_steps_are_read_without_waiting_yet_all_arrive_in_order(tmp_path: Path) -> None:
    """Timed and untimed steps on CUDA, live edges on: records come off the device a step
    late, but every step arrives once, in order, with its loss, and edges are announced."""
    runtime = RuntimeOptions(
        edges_factory=QUIET_EDGES,
        timed="alternate",
        alternate_every=3,
        announce_min_ms=0,  # every gap here is sub-millisecond: announce them anyway
    )
    job = run_job(tmp_path / "run", 1, cuda_text_config(steps=12, runtime=runtime))
    assert job.returncode == 0, log_tail(job.run_dir)
    evs = job.events[0]
    steps = of_kind(evs, "step")
    assert [s["step"] for s in steps] == list(range(12))
    assert all(s["loss"] is not None for s in steps)
    for s in steps:
        marks = [s["start_ns"], s["end_ns"], s["optimizer_start_ns"], s["optimizer_end_ns"]]
        assert marks == sorted(marks), s
    timed = {0, 1, 2, 6, 7, 8}
    assert {a["step"] for a in of_kind(evs, "action")} == timed
    assert {e["step"] for e in of_kind(evs, "bubble_edge") if e["edge"] == "start"} >= timed
