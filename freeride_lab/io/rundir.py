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
import logging
import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

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
    # damaged files already reported: (name, mtime_ns, size); see _warn_once
    _warned: set[tuple[str, int, int]] = field(
        default_factory=set, init=False, repr=False, compare=False
    )

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
        """run.json as a dict; fields of the wrong type are left out, with one warning.

        Raises:
            FileNotFoundError: there is no run.json.
            ValueError: run.json cannot be read as a JSON object; the message names the file.
        """
        data, problem = self._read_object(self.run_json)
        if data is None:
            raise ValueError(f"{self.run_json} {problem}")
        return self._typed(self.run_json, data, _RUN_FIELDS)

    def read_status(self) -> dict[str, Any]:
        """status.json as a dict: {} if it is missing, or damaged (logged once), and fields of
        the wrong type left out; a reader then judges the run as if it had no status."""
        try:
            data, problem = self._read_object(self.status_json)
        except FileNotFoundError:
            return {}
        if data is None:
            self._warn_once(self.status_json, f"{problem}; reading the run without it")
            return {}
        return self._typed(self.status_json, data, _STATUS_FIELDS)

    @staticmethod
    def _read_object(path: Path) -> tuple[dict[str, Any] | None, str]:
        """(the JSON object in ``path``, "") or (None, what is wrong with the file).

        Raises:
            FileNotFoundError: ``path`` does not exist.
        """
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            raise
        except (OSError, ValueError, RecursionError) as e:
            return None, f"cannot be read as JSON ({type(e).__name__}: {e})"
        if not isinstance(data, dict):
            return None, f"holds a JSON {type(data).__name__}, not an object"
        return data, ""

    def _typed(
        self, path: Path, data: dict[str, Any], rules: Mapping[str, tuple[type, ...]]
    ) -> dict[str, Any]:
        """``data`` without the known fields whose value has the wrong type."""
        wrong = [k for k, types in rules.items() if k in data and not _fits(data[k], types)]
        if not wrong:
            return data
        shown = ", ".join(f"{k}={data[k]!r:.40}" for k in wrong)
        self._warn_once(path, f"has fields of the wrong type ({shown}); they are ignored")
        return {k: v for k, v in data.items() if k not in wrong}

    def _warn_once(self, path: Path, text: str) -> None:
        """Log ``path`` ``text`` once per ``RunDir`` and version of the file (state and status
        are read on every poll)."""
        try:
            stat = path.stat()
            key = (path.name, stat.st_mtime_ns, stat.st_size)
        except OSError:
            key = (path.name, 0, 0)
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s %s", path, text)


# What readers rely on in run.json and status.json: field -> allowed types (an int field
# takes no bool). Others pass as they are.
_RUN_FIELDS: dict[str, tuple[type, ...]] = {
    "run_id": (str,),
    "config": (dict,),
    "created_ns": (int,),
    "bus": (dict,),
    "owner_pid": (int,),
    "launcher_pid": (int, type(None)),
    "rank_entry": (list,),
    "grace_s": (int, float),
    "host": (str,),
    "versions": (dict,),
    "mps": (dict,),
    "detached": (bool,),
    "keeper": (dict,),
}
_STATUS_FIELDS: dict[str, tuple[type, ...]] = {
    "state": (str,),
    "reason": (str,),
    "launcher_pid": (int, type(None)),
    "torchrun_pid": (int, type(None)),
    "exit_code": (int, type(None)),
    "failed_rank": (int, type(None)),
    "ended_ns": (int,),
    "t_ns": (int,),
    "command": (list,),
}


def _fits(value: object, types: tuple[type, ...]) -> bool:
    return isinstance(value, types) and (bool in types or not isinstance(value, bool))
