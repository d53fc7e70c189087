"""Claims about how ``freeride-lab`` words an operating-system error at launch (one clean line)."""

from __future__ import annotations

import contextlib
import errno
import io
from pathlib import Path
from unittest import mock

import pytest

from freeride_lab.cli.app import main, os_error_text
from freeride_lab.lab.session import Session

RUN = ["run", "--workload", "synthetic", "--stages", "2", "--microbatches", "2", "--steps", "1"]


def run_cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


@pytest.mark.parametrize(
    ("error", "path"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), None),
        (PermissionError(errno.EACCES, "Permission denied"), None),
        (OSError(errno.EROFS, "Read-only file system"), "named"),
    ],
    ids=["enospc", "eacces", "erofs-with-filename"],
)
def test_an_os_error_at_launch_is_one_line_of_clean_text_naming_the_path(
    tmp_path: Path, error: OSError, path: str | None
) -> None:
    run_dir = tmp_path / "run"
    if path is not None:
        error.filename = str(run_dir)
    else:
        error.strerror = f"{error.strerror}: cannot create run directory {run_dir}"
    with mock.patch.object(Session, "launch", side_effect=error):
        code, err = run_cli([*RUN, "--run-dir", str(run_dir)])
    assert code == 2
    assert err.startswith("freeride-lab: error: ") and err.count("\n") == 1, err
    assert "[Errno" not in err and "Traceback" not in err, err
    assert str(run_dir) in err and str(error.strerror).split(":")[0] in err, err


def test_os_error_text_keeps_the_message_and_adds_each_path_once() -> None:
    e = OSError(errno.EXDEV, "Invalid cross-device link", "/a/run", None, "/b/run")
    assert os_error_text(e) == "Invalid cross-device link: /a/run: /b/run"
    named = OSError(errno.ENOSPC, "only 1 MiB free under /a/run")
    named.filename = "/a/run"
    assert os_error_text(named) == "only 1 MiB free under /a/run"


def test_os_error_text_of_an_error_without_errno_is_its_message() -> None:
    assert os_error_text(OSError("disk went away")) == "disk went away"
