"""The run directory belongs to the user who launched the run, and nobody else can use it.

Whoever can write into a run directory can swap its secret and then drive the run's side-task
workers (which run code as the launching user). So a run refuses a directory that is a symlink,
another user's, or open to others, before anything starts; every file of the run is created
without following links; each process reads the secret once, when it starts; archives and
reports of a run never carry the secret. See [Note: a private run directory] in
``freeride_lab/io/rundir.py``.
"""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Iterator
from multiprocessing import AuthenticationError
from pathlib import Path

import psutil
import pytest
from runs import synthetic_config

from freeride_lab.core.config import RunConfig
from freeride_lab.core.runtime_options import RuntimeOptions
from freeride_lab.io.rundir import RunDir, check_private_dir
from freeride_lab.io.sink import EventSink
from freeride_lab.lab.archive import pack
from freeride_lab.lab.preflight import check_environment
from freeride_lab.lab.session import Session
from freeride_lab.sidetasks.client import WorkerClient, WorkerProcess, start_worker

NOBODY = 65534
STARTUP_S = 240.0  # first step of a fresh run on a loaded box (a torch import per process)


def tiny(steps: int = 3) -> RunConfig:
    return synthetic_config(
        steps=steps, microbatches=2, phase_ms=5.0, microbatch_size=4, runtime=RuntimeOptions()
    )


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()}


def refused_at_launch(path: Path) -> str:
    """Launch into ``path``: the one-line refusal; asserts that nothing started or was written."""
    before_children = children()
    before_files = sorted(os.listdir(path)) if path.is_dir() and not path.is_symlink() else None
    with pytest.raises(PermissionError) as info:
        Session.launch(tiny(), run_dir=path)
    assert children() <= before_children, "a refused launch started a process"
    if before_files is not None:
        assert sorted(os.listdir(path)) == before_files, "a refused launch wrote into the dir"
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


# -- directories a run refuses -------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another uid needs root")
def test_a_directory_of_another_user_is_refused_before_anything_starts(tmp_path: Path) -> None:
    path = tmp_path / "run"
    path.mkdir(mode=0o700)
    os.chown(path, NOBODY, NOBODY)
    message = refused_at_launch(path)
    assert f"belongs to uid {NOBODY}" in message


@pytest.mark.parametrize("mode", [0o770, 0o777, 0o1777, 0o750, 0o705])
def test_a_directory_others_can_enter_is_refused_before_anything_starts(
    tmp_path: Path, mode: int
) -> None:
    path = tmp_path / "run"
    path.mkdir()
    os.chmod(path, mode)
    message = refused_at_launch(path)
    assert f"mode {mode:04o}" in message and "0700" in message
    assert stat.S_IMODE(path.stat().st_mode) == mode  # not taken over either


def test_a_symlinked_directory_is_refused_before_anything_starts(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    path = tmp_path / "run"
    path.symlink_to(target)
    assert "symlink" in refused_at_launch(path)
    assert not any(target.iterdir())


def test_a_dangling_symlink_is_refused_and_nothing_appears_at_its_target(tmp_path: Path) -> None:
    path = tmp_path / "run"
    path.symlink_to(tmp_path / "planted")
    assert "symlink" in refused_at_launch(path)
    assert not (tmp_path / "planted").exists()


def test_an_empty_private_directory_of_this_user_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "run"
    path.mkdir(mode=0o700)
    check_environment(tiny(), path)
    secret = RunDir(path).create()
    assert RunDir(path).secret() == secret


def test_a_run_dir_is_created_private_even_if_someone_races_the_preflight(tmp_path: Path) -> None:
    """Between the check and the creation another process plants a shared directory: the
    creation itself refuses it (it does not chmod someone's directory into a run)."""
    path = tmp_path / "run"
    check_environment(tiny(), path)
    path.mkdir()
    os.chmod(path, 0o777)
    with pytest.raises(PermissionError, match="mode 0777"):
        RunDir(path).create()
    assert not any(path.iterdir())


def test_check_private_dir_names_the_problem_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "shared"
    path.mkdir()
    os.chmod(path, 0o775)
    with pytest.raises(PermissionError) as info:
        check_private_dir(path)
    assert "chmod 700" in str(info.value) and "does not exist yet" in str(info.value)


# -- files in a run directory --------------------------------------------------------------------


@pytest.fixture
def run(tmp_path: Path) -> RunDir:
    rd = RunDir(tmp_path / "run")
    rd.create()
    return rd


def test_the_run_files_never_follow_a_planted_symlink(run: RunDir, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    (run.events_dir / "rank-0.jsonl").symlink_to(victim)
    with pytest.raises(OSError):
        EventSink.for_rank(run, 0)
    assert victim.read_text() == "untouched\n"


def test_a_secret_that_others_can_read_is_refused(run: RunDir) -> None:
    os.chmod(run.secret_file, 0o644)
    with pytest.raises(PermissionError, match="mode 0600"):
        run.secret()


def test_a_secret_replaced_by_a_symlink_is_refused(run: RunDir, tmp_path: Path) -> None:
    planted = tmp_path / "planted-secret"
    planted.write_text("ab" * 32)
    os.chmod(planted, 0o600)
    run.secret_file.unlink()
    run.secret_file.symlink_to(planted)
    with pytest.raises(OSError):
        run.secret()


@pytest.fixture
def worker(run: RunDir) -> Iterator[WorkerProcess]:
    process = start_worker(run.path, 0)
    process.client(timeout_s=60)  # listening
    yield process
    process.stop()


def test_replacing_the_secret_during_a_run_does_not_let_a_client_in(
    run: RunDir, worker: WorkerProcess
) -> None:
    original = run.secret()
    client = worker.client(timeout_s=60)
    assert client.status().ok

    run.secret_file.unlink()  # what a user with write access to the directory would do
    forged = os.urandom(32)
    fd = os.open(run.secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(forged.hex())

    with pytest.raises(AuthenticationError):
        WorkerClient(client.address, forged, timeout_s=10).status()
    assert WorkerClient(client.address, original, timeout_s=10).status().ok


# -- what leaves the run directory ---------------------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    root = tmp_path_factory.mktemp("runs")
    with Session.launch(tiny(), run_dir=root / "run", grace_s=3) as session:
        session.wait(timeout_s=STARTUP_S)
        yield session


def files_holding(root: Path, needle: bytes) -> list[str]:
    return [
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and needle in p.read_bytes()
    ]


@pytest.mark.parametrize("kind", ["logs", "events"])
def test_archives_of_runs_never_hold_the_secret(
    finished: Session, tmp_path: Path, kind: str
) -> None:
    rd = finished.run_dir
    secret_hex = rd.secret().hex().encode()
    out = tmp_path / f"{kind}.tgz"
    members = pack(rd.path.parent, out, kind)  # type: ignore[arg-type]
    assert members, "nothing packed"
    with tarfile.open(out) as tar:
        names = tar.getnames()
        assert not [n for n in names if Path(n).name == "secret"]
        for member in tar.getmembers():
            data = tar.extractfile(member)
            assert data is None or secret_hex not in data.read(), member.name
    if kind == "logs":
        assert any(n.endswith("run.json") for n in names)
        assert not any("/events/" in f"/{n}" for n in names)
    else:
        assert all("/events/" in f"/{n}" for n in names)


def test_a_report_bundle_never_holds_the_secret(finished: Session, tmp_path: Path) -> None:
    pytest.importorskip("plotly")
    secret = finished.run_dir.secret()
    out = tmp_path / "report"
    finished.report(out / "run.html")
    assert (out / "run.html").is_file()
    assert files_holding(out, secret.hex().encode()) == []
    assert files_holding(out, secret) == []
