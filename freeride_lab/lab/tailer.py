"""``EventTailer``: reads a run's event files incrementally and merges the live bus with them.

It remembers byte offsets per file, leaves a partial last line for later, and hands out each
event exactly once, whether it came over the bus or from the file; lines that are not usable
events are skipped and counted (see [Note: damaged event files]).

    tailer = EventTailer(RunDir(path))
    tailer.poll()                      # whatever was appended since the last poll
    read_events(path)                  # every usable event, read once
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from freeride_lab.core.events import check_dict
from freeride_lab.io.bus import BusBatch
from freeride_lab.io.rundir import RunDir
from freeride_lab.lab.event_columns import Event

log = logging.getLogger(__name__)

__all__ = ["EventTailer", "read_events"]


class EventTailer:
    """Reads each event file of a run incrementally and merges live bus batches exactly once.

    Per file it remembers the byte offset up to which lines were handed out. ``poll`` reads
    complete lines past it; ``feed`` takes a ``BusBatch`` (the same bytes, sent by the writer
    right after appending them) and hands out only the part not yet seen, first reading any gap
    left by dropped batches from the file.

    Every line is checked (``core.events.check_dict``) before it is handed out: a line that is
    not JSON, not an object, or not a usable event (a field missing or of the wrong type) is
    skipped and counted in ``bad_lines``, and each read that skipped some logs one warning per
    file with the count and the first bad line's number (see [Note: damaged event files]).
    """

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self.offsets: dict[str, int] = {}  # file name -> bytes consumed
        self.lines: dict[str, int] = {}  # file name -> lines consumed (numbers bad lines)
        self.bad_lines = 0  # lines skipped: not JSON objects, or not usable events
        self.bad_lines_by_file: dict[str, int] = {}
        self.missing_bytes = 0  # gaps the bus left that the local file could not fill
        self._unreadable: set[str] = set()  # files whose read failed, "/" for events/ (logged once)

    def poll(self, *, final: bool = False) -> list[Event]:
        """New complete lines of every event file, ranks first, then workers.

        Args:
            final: the writers have ended (the run is over): a last line without its newline
                is read too (an event if it is whole, else a bad line), not left for later.
        """
        if not self.run_dir.events_dir.is_dir():  # made at launch: gone means damaged
            if "/" not in self._unreadable:
                self._unreadable.add("/")
                log.warning(
                    "%s is missing: this run has no events to read", self.run_dir.events_dir
                )
            return []
        out: list[Event] = []
        for path in self.run_dir.event_files():
            out.extend(self._read(path.name, self.offsets.get(path.name, 0), None, final=final))
        return out

    def feed(self, batch: BusBatch) -> list[Event]:
        """The not-yet-seen events of a bus batch (plus any gap before it, read from the file)."""
        have = self.offsets.get(batch.source, 0)
        if batch.end <= have:
            return []
        out: list[Event] = []
        if batch.offset > have:
            out.extend(self._read(batch.source, have, batch.offset))
            have = self.offsets.get(batch.source, have)
            if have < batch.offset:  # the file is not here (another node) or shorter
                self.missing_bytes += batch.offset - have
                have = batch.offset
        out.extend(self._parse(batch.payload[have - batch.offset :], batch.source))
        self.offsets[batch.source] = batch.end
        return out

    def _read(self, name: str, start: int, stop: int | None, *, final: bool = False) -> list[Event]:
        path = self.run_dir.events_dir / name
        try:
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read() if stop is None else f.read(stop - start)
        except FileNotFoundError:
            return []
        except OSError as e:  # a directory, no permission, an I/O error: the others still read
            if name not in self._unreadable:
                self._unreadable.add(name)
                log.warning("%s: cannot read it (%s); the run's other files are read", path, e)
            return []
        complete = data if final else data[: data.rfind(b"\n") + 1]
        if not complete:
            return []  # a partial last line waits for the next read
        self.offsets[name] = start + len(complete)
        return self._parse(complete, name)

    def _parse(self, payload: bytes, source: str) -> list[Event]:
        out: list[Event] = []
        first_line = self.lines.get(source, 0) + 1
        rows = payload.split(b"\n")
        if payload.endswith(b"\n"):
            rows.pop()
        bad, first_bad, why = 0, 0, ""
        for number, line in enumerate(rows, start=first_line):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                check_dict(obj)
            except (ValueError, RecursionError) as e:  # RecursionError: "[[[[…" nested deeply
                if not bad:
                    first_bad, why = number, _reason(e, line)
                bad += 1
                continue
            out.append(obj)
        self.lines[source] = first_line - 1 + len(rows)
        if bad:
            self.bad_lines += bad
            self.bad_lines_by_file[source] = self.bad_lines_by_file.get(source, 0) + bad
            log.warning(
                "%s: skipped %d line(s) that are not valid events, the first at line %d (%s); "
                "the file's other lines are read",
                self.run_dir.events_dir / source,
                bad,
                first_bad,
                why,
            )
        return out


def _reason(error: Exception, line: bytes) -> str:
    """Why a line is bad, in a few words (see ``EventTailer._parse``)."""
    if isinstance(error, RecursionError):
        return "nested too deeply to decode"
    if isinstance(error, json.JSONDecodeError | UnicodeDecodeError):
        return f"not JSON: {line[:40]!r}"
    return str(error)


# [Note: damaged event files]
# An event file can be damaged after it was written: a copy cut short, a disk error, a hand
# edit. Readers (``Session.open``, ``freeride-lab status|report``, the dashboard) then work on
# what is left: the tailer skips each line that is not a usable event and counts it
# (``bad_lines``, ``bad_lines_by_file``), logging one warning per file and read, with the count
# and the first bad line's number, so that a damaged file of a million lines logs one line,
# not a million. Line numbers count from 1 over the lines this tailer has read of the file
# (for a file on another node, from the first batch the bus carried). A last line without its
# newline is a line still being written while the run is live; once the run is over
# (``poll(final=True)``) it is read as it is, so a line cut short shows up as bad.


def read_events(run_dir: RunDir | Path, *, final: bool = False) -> list[Event]:
    """Every usable event of a run directory, read once from its files (damaged lines are
    skipped and logged: see [Note: damaged event files]); ``final`` as in ``EventTailer.poll``."""
    rd = run_dir if isinstance(run_dir, RunDir) else RunDir(Path(run_dir))
    return EventTailer(rd).poll(final=final)
