"""Claims about the ``freeride-lab`` command line: its grammar, its errors, and ``run``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from waits import run_processes, wait_until

from freeride_lab.cli.app import SUBCOMMANDS, build_parser, main

REPO = Path(__file__).resolve().parents[2]
STARTUP_S = 240.0  # first step of a fresh run on a loaded two-core box
TINY = [
    "--schedule", "1F1B", "--stages", "2", "--microbatches", "2", "--workload", "synthetic",
    "--t-forward-ms", "5", "--t-backward-input-ms", "5", "--t-backward-weight-ms", "5",
    "--d-model", "16", "--seq-len", "8", "--microbatch-size", "2", "--grace-s", "3",
]  # fmt: skip


def cli(*args: str, cwd: Path, new_session: bool = False, **popen: object) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.Popen(  # type: ignore[call-overload,no-any-return]
        [sys.executable, "-m", "freeride_lab.cli", *args],
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=new_session,
        **popen,
    )


# Positional arguments of the subcommands that require some (placeholders: only parsed).
REQUIRED_ARGS = {
    "status": ["RUN"], "attach": ["RUN", "TASK"], "tune": ["RUN", "ID"],
    "checkpoint": ["RUN", "ID"], "detach": ["RUN", "ID"], "stop": ["RUN"],
    "report": ["RUN", "PATH"],
}  # fmt: skip


def test_parser_has_every_registered_subcommand() -> None:
    parser = build_parser(prog="%freeride")
    for name in SUBCOMMANDS:
        assert parser.parse_args([name, *REQUIRED_ARGS.get(name, [])]).command == name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--stages", "0"], "stages=0"),
        (["run", "--schedule", "1f2b"], "'1f2b'"),
        (["run", "--stages", "many"], "'many'"),
        (["run", "--stages", "4", "--microbatches", "2"], "microbatches"),
        (["run", "--predictor", "oracle"], "'oracle'"),
        (["lunch"], "'lunch'"),
    ],
)
def test_bad_input_prints_one_error_line_and_exits_2(
    args: list[str], message: str, tmp_path: Path
) -> None:
    proc = cli(*args, cwd=tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert err.startswith("freeride-lab: error: ") and err.count("\n") == 1, err
    assert message in err
    assert "Traceback" not in out + err
    assert list(tmp_path.iterdir()) == []  # no run directory, nothing started


@pytest.mark.parametrize("command", ["run", "launch"])
@pytest.mark.parametrize(
    ("words", "predictor", "outlived"),
    [([], "min", "stop"), (["--predictor", "peers", "--outlived", "hand-on"], "peers", "hand-on")],
)
def test_a_run_takes_its_bubble_predictor_and_what_a_task_does_past_it(
    command: str, words: list[str], predictor: str, outlived: str
) -> None:
    from freeride_lab.cli.app import run_config_fields
    from freeride_lab.core.config import RunConfig

    args = build_parser(prog="freeride-lab").parse_args([command, *words])
    runtime = RunConfig(**run_config_fields(args)).runtime
    assert (runtime.predictor, runtime.outlived) == (predictor, outlived)


def test_master_port_in_use_is_a_usage_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = cli("run", *TINY, "--steps", "1", "--master-port", str(port), cwd=tmp_path)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert f"master_port={port} is already in use" in err
    assert list(tmp_path.iterdir()) == []


def test_simulate_prints_idle_time_next_to_theory(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", "--schedule", "1F1B", "--stages", "4", "--microbatches", "4"])
    out = capsys.readouterr().out
    assert code == 0
    assert "theory_pct" in out and "42.86" in out  # (S-1)/(M+S-1) = 3/7


def test_run_prints_the_bubble_tables_and_the_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = cli(
        "run", *TINY, "--steps", "3", "--run-dir", str(run_dir), "--no-progress", cwd=tmp_path
    )
    out, err = proc.communicate(timeout=STARTUP_S + 60)
    assert proc.returncode == 0, err
    assert "Bubbles per rank" in out and "Measured vs theory" in out
    assert "measured_pct" in out and "theory_pct" in out
    # why the bubbles are above theory, beside it: ms per step in three parts
    header = next(line for line in out.splitlines() if "theory_pct" in line).split()
    assert header[-3:] == ["schedule_ms", "peer_ms", "host_ms"]
    assert f"run directory: {run_dir}" in out
    assert run_processes(run_dir) == []


def test_ctrl_c_stops_the_run_cleanly(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    events = run_dir / "events" / "rank-1.jsonl"
    proc = cli(
        "run", *TINY, "--steps", "100000", "--run-dir", str(run_dir), "--no-progress",
        cwd=tmp_path, new_session=True,  # its own group, as a terminal's foreground job
    )  # fmt: skip
    try:
        wait_until(
            lambda: events.exists() and b'"kind":"step"' in events.read_bytes(),
            timeout_s=STARTUP_S,
            what="the first step",
        )
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted; stopping the run" in err
    assert json.loads((run_dir / "status.json").read_text())["state"] == "stopped"
    assert run_processes(run_dir) == []
