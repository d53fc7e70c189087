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
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["RunDir"]


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
        return sorted(self.events_dir.glob("*.jsonl"), key=lambda p: (p.stem.split("-")[0] != "rank", p.stem))

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
        return json.loads(self.run_json.read_text())

    def read_status(self) -> dict[str, Any]:
        try:
            return json.loads(self.status_json.read_text())
        except FileNotFoundError:
            return {}
