"""Launch faults: a full disk or an unwritable run directory at launch gives one
clear error and starts nothing. (A path through a file is covered by
``tests/lab/test_session.py::test_unwritable_run_dir_raises_os_error_naming_the_path``.)

The disk is made "full" by faking what the OS answers (``shutil.disk_usage``, or ENOSPC from
the first write); the processes are checked by walking the process table.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import shutil
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import psutil
import pytest

from freeride_lab.cli.app import main
from freeride_lab.core.config import RunConfig
from freeride_lab.io.rundir import RunDir
from freeride_lab.lab.session import Session

CONFIG = RunConfig(workload="synthetic", stages=2, microbatches=2, steps=1)
Usage = namedtuple("Usage", "total used free")


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@contextlib.contextmanager
def nothing_started() -> Iterator[None]:
    before = children()
    yield
    assert children() <= before, f"new processes: {children() - before}"


@contextlib.contextmanager
def disk_with_free_bytes(free: int) -> Iterator[None]:
    real = shutil.disk_usage

    def fake(path: str | os.PathLike[str]) -> Usage:
        total, used, _ = real(path)
        return Usage(total, used, free)

    with mock.patch("freeride_lab.lab.preflight.shutil.disk_usage", fake):
        yield


def test_a_full_disk_at_launch_is_one_clear_error_and_starts_nothing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with (
        disk_with_free_bytes(1 << 20),
        nothing_started(),
        pytest.raises(OSError, match="only 1 MiB free") as raised,
    ):
        Session.launch(CONFIG, run_dir=run_dir)
    assert raised.value.errno == errno.ENOSPC
    assert str(run_dir) in str(raised.value) and "\n" not in str(raised.value)
    assert not run_dir.exists()


def test_a_full_disk_at_launch_is_one_error_line_from_the_command_line(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    argv = ["run", "--workload", "synthetic", "--stages", "2", "--run-dir", str(tmp_path / "run")]
    with (
        disk_with_free_bytes(1 << 20),
        nothing_started(),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        code = main(argv)
    assert code == 2
    assert err.getvalue().startswith("freeride-lab: error: ")
    assert "cannot create run directory" in err.getvalue()
    assert err.getvalue().count("\n") == 1 and "Traceback" not in out.getvalue() + err.getvalue()
    assert not (tmp_path / "run").exists()


def test_a_disk_that_fills_while_the_run_directory_is_made_is_one_clear_error(
    tmp_path: Path,
) -> None:
    def no_space(self: RunDir) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    run_dir = tmp_path / "run"
    with (
        mock.patch.object(RunDir, "create", no_space),
        nothing_started(),
        pytest.raises(OSError, match=re.escape(f"cannot create run directory {run_dir}")),
    ):
        Session.launch(CONFIG, run_dir=run_dir)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through any directory mode")
def test_a_read_only_parent_is_one_clear_error_and_starts_nothing(tmp_path: Path) -> None:
    parent = tmp_path / "read-only"
    parent.mkdir()
    os.chmod(parent, 0o555)
    try:
        with nothing_started(), pytest.raises(PermissionError, match="is not writable"):
            Session.launch(CONFIG, run_dir=parent / "run")
    finally:
        os.chmod(parent, 0o755)
    assert not (parent / "run").exists()
