"""The run directory: the one source of truth of a run.

Layout::

    <run_dir>/                 mode 0700
      run.json                 RunConfig.to_dict() under "config", plus run_id, created_ns,
                               bus address, launcher pid, versions
      secret                   per-run secret (hex), mode 0600
      events/rank-<r>.jsonl    events of training rank r, one JSON object per line
      events/worker-<r>.jsonl  events of the side-task worker beside rank r
      logs/                    per-process stdout/stderr
      status.json              launcher's view: state, exit codes, reason

# [Note: a private run directory]
Whoever can write into a run directory can swap its secret and drive the run's side-task
workers, which run code as the launching user. So a run directory is created by the run itself
(``mkdir`` with mode 0700, parents as the umask says), or is an existing *empty* directory that
is no symlink, belongs to this user and is mode 0700 or stricter (``check_private_dir``); files
in it are created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (append-only logs with
``O_NOFOLLOW``), the secret mode 0600. Each process reads the secret once, when it starts
(``secret()`` checks that the file and its directory are this user's and private), and keeps it
in memory: a secret replaced on disk during a run lets nobody in.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PRIVATE_FILES", "RunDir", "check_private_dir", "create_file", "open_append"]

PRIVATE_FILES = frozenset({"secret"})  # never leaves the run directory (archives, reports)

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def create_file(path: str | os.PathLike[str], mode: int = 0o600) -> int:
    """A new file's descriptor, open for writing; fails if ``path`` exists or is a symlink."""
    return os.open(path, _NEW, mode)


def open_append(path: str | os.PathLike[str], mode: int = 0o600) -> int:
    """A descriptor appending to ``path`` (created if missing); fails on a symlink."""
    return os.open(path, _APPEND, mode)


def check_private_dir(path: str | os.PathLike[str], *, empty: bool = False) -> None:
    """Raise unless ``path`` is a directory of this user, no symlink, mode 0700 or stricter.

    Args:
        empty: also require it to hold nothing (a run directory that is about to be created).

    Raises:
        PermissionError: a symlink, another user's directory, or one that others can enter.
        NotADirectoryError: ``path`` is a file.
        ValueError: ``empty`` and the directory holds something.
    """
    st = os.lstat(path)
    fix = "pass run_dir= a path that does not exist yet (the run creates it, mode 0700)"
    if stat.S_ISLNK(st.st_mode):
        raise PermissionError(
            errno.EPERM,
            f"run directory {str(path)!r} is a symlink; a run never follows one; {fix}",
        )
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(
            errno.ENOTDIR, f"run directory {str(path)!r} is not a directory; {fix}"
        )
    if empty and any(os.scandir(path)):
        raise ValueError(
            f"run_dir={str(path)!r} exists and is not empty; pass a new directory, "
            "or run_dir=None for a fresh one under ./runs"
        )
    if st.st_uid != os.geteuid():
        raise PermissionError(
            errno.EPERM,
            f"run directory {str(path)!r} belongs to uid {st.st_uid}, not to this user "
            f"(uid {os.geteuid()}): its owner could swap the run's secret; {fix}",
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise PermissionError(
            errno.EPERM,
            f"run directory {str(path)!r} has mode {stat.S_IMODE(st.st_mode):04o}; a run "
            f"directory must be 0700 or stricter (others could read or swap its secret); "
            f"chmod 700 it, or {fix}",
        )


@dataclass(frozen=True)
class RunDir:
    """Paths of one run directory (creating nothing until asked)."""

    path: Path

    @property
    def run_json(self) -> Path:
        return self.path / "run.json"

    @property
    def secret_file(self) -> Path:
        return self.path / "secret"

    @property
    def events_dir(self) -> Path:
        return self.path / "events"

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    @property
    def status_json(self) -> Path:
        return self.path / "status.json"

    def rank_events(self, rank: int) -> Path:
        return self.events_dir / f"rank-{rank}.jsonl"

    def worker_events(self, rank: int) -> Path:
        return self.events_dir / f"worker-{rank}.jsonl"

    def event_files(self) -> list[Path]:
        """All event files present now, ranks first, in rank order."""
        if not self.events_dir.is_dir():
            return []
        return sorted(
            self.events_dir.glob("*.jsonl"), key=lambda p: (p.stem.split("-")[0] != "rank", p.stem)
        )

    def create(self) -> bytes:
        """Make the directory tree, private, with a fresh secret; return the secret.

        See [Note: a private run directory]. Parents are made as needed; the directory itself
        must not exist yet, or be empty, this user's, no symlink and mode 0700 or stricter.

        Raises:
            PermissionError, NotADirectoryError, ValueError: from ``check_private_dir``.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(self.path, 0o700)
        except FileExistsError:
            check_private_dir(self.path, empty=True)
        os.chmod(self.path, 0o700, follow_symlinks=False)  # the umask may have taken bits
        check_private_dir(self.path)  # swapped between mkdir and here: refuse
        self.events_dir.mkdir(mode=0o700)
        self.logs_dir.mkdir(mode=0o700)
        secret = secrets.token_bytes(32)
        with os.fdopen(create_file(self.secret_file), "w") as f:
            f.write(secret.hex())
        return secret

    def secret(self) -> bytes:
        """The run's secret, read from disk; a process calls this once, when it starts.

        Raises:
            PermissionError: the file or its directory is not this user's, or not private.
            FileNotFoundError: no secret (not a run directory, or a damaged one).
        """
        check_private_dir(self.path)
        fd = os.open(self.secret_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd) as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
                raise PermissionError(
                    errno.EPERM,
                    f"{self.secret_file} must be this user's and mode 0600 (it is uid "
                    f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}); the run directory was "
                    "tampered with",
                )
            return bytes.fromhex(f.read(256).strip())

    def write_json(self, path: Path, data: dict[str, Any]) -> None:
        """Write JSON atomically (readers never see a half-written file).

        The temporary file is new (``O_EXCL | O_NOFOLLOW``), named for this process, and
        renamed over ``path``.
        """
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            with os.fdopen(create_file(tmp), "w") as f:
                f.write(json.dumps(data, indent=2, sort_keys=True, default=str))
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def read_run(self) -> dict[str, Any]:
        return json.loads(self.run_json.read_text())

    def read_status(self) -> dict[str, Any]:
        try:
            return json.loads(self.status_json.read_text())
        except FileNotFoundError:
            return {}
