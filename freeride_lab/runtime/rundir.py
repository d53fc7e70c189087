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
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["RunDir"]


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

    def create(self) -> None:
        """Make the directory tree with private permissions and a fresh secret."""
        self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.path, 0o700)
        self.events_dir.mkdir(exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        if not self.secret_file.exists():
            fd = os.open(self.secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))

    def secret(self) -> bytes:
        return bytes.fromhex(self.secret_file.read_text().strip())

    def write_json(self, path: Path, data: dict[str, Any]) -> None:
        """Write JSON atomically (readers never see a half-written file)."""
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
        os.replace(tmp, path)

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
