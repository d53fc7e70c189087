"""Who waited for a CPU while a command ran: each process's run-queue wait, and the machine's.

A side task's host sees a bubble's edge and calls ``step()`` in a few dozen microseconds of
Python on an idle machine (``bench_host_path.py``); in a bench run the same path has taken two
to four times that, by call. A process that is ready but waits for a CPU (other processes of
the run on every core, or a hypervisor that lends the core elsewhere: *steal*) adds that wait to
any path it is on. This script runs a command and, while it runs, samples every process of its
tree (``psutil``) and what the kernel says each waited:

- ``/proc/PID/schedstat``: time on a CPU and time **ready but waiting on a run queue**, summed
  over the process's threads, and the same for its main thread alone (a task host's steps and
  edges run there);
- involuntary context switches (the process was preempted) and voluntary ones (it slept);
- the machine's CPU time by kind (``psutil.cpu_times``): busy, idle and ``steal``.

Each process is labelled by what it runs (a pipeline rank, a task host, the side-task worker,
the bench itself) from its command line. A process's figures are its last sample's, so up to one
interval of a process that ends is missed. Where the kernel keeps no schedstat the waits are
absent (``None``), not zero.

    python benchmarks/run_queue.py --out run-queue.json -- freeride-lab bench --quick ...

The command's exit status is this script's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from bench_output import command_line, cpu_model, write_results

#: What a process runs, by a module its command line names (first match wins).
ROLES: tuple[tuple[str, str], ...] = (
    ("freeride_lab.sidetasks.host", "task host"),
    ("freeride_lab.sidetasks.worker", "side-task worker"),
    ("freeride_lab.pipeline.rank", "pipeline rank"),
    ("freeride_lab.pipeline.torchrun", "torchrun"),
    ("freeride_lab.pipeline.launcher", "pipeline launcher"),
    ("freeride_lab.cli", "bench"),
    ("freeride-lab", "bench"),
)


def role_of(cmdline: list[str]) -> str:
    """The role a command line names (``ROLES``), or its program's name.

    >>> role_of(["python3", "-m", "freeride_lab.sidetasks.host", "--fd", "3"])
    'task host'
    >>> role_of(["/usr/bin/nvidia-smi", "-q"])
    'nvidia-smi'
    """
    joined = " ".join(cmdline)
    for needle, role in ROLES:
        if needle in joined:
            return role
    return Path(cmdline[0]).name if cmdline else "?"


def read_schedstat(path: Path) -> tuple[int, int, int] | None:
    """(ns on a CPU, ns waiting on a run queue, timeslices) from a ``schedstat`` file; None
    where the file is missing, unreadable or says nothing (a kernel without schedstats)."""
    try:
        fields = path.read_text().split()
        on_cpu, waited, slices = (int(x) for x in fields[:3])
    except (OSError, ValueError):
        return None
    if on_cpu == 0 and slices <= 1 and waited == 0:
        return None
    return on_cpu, waited, slices


@dataclass
class ProcessRecord:
    """One process of the tree, as last sampled."""

    pid: int
    role: str
    first_s: float  # seconds after the command started when it was first seen
    last_s: float = 0.0
    cpu_s: float = 0.0  # user + system, psutil
    wait_s: float | None = None  # run-queue wait, all threads (schedstat)
    main_thread_wait_s: float | None = None
    main_thread_cpu_s: float | None = None
    involuntary_switches: int = 0
    voluntary_switches: int = 0
    threads: int = 0

    def sample(self, proc: psutil.Process, t_s: float) -> None:
        with proc.oneshot():
            times = proc.cpu_times()
            switches = proc.num_ctx_switches()
            tids = [t.id for t in proc.threads()]
        self.last_s = t_s
        self.cpu_s = times.user + times.system
        self.involuntary_switches = switches.involuntary
        self.voluntary_switches = switches.voluntary
        self.threads = len(tids)
        stats = [read_schedstat(Path(f"/proc/{self.pid}/task/{tid}/schedstat")) for tid in tids]
        known = [s for s in stats if s is not None]
        if known:
            self.wait_s = sum(s[1] for s in known) / 1e9
        main = read_schedstat(Path(f"/proc/{self.pid}/task/{self.pid}/schedstat"))
        if main is not None:
            self.main_thread_cpu_s, self.main_thread_wait_s = main[0] / 1e9, main[1] / 1e9


@dataclass
class Machine:
    """The machine's CPU time by kind over the command (psutil.cpu_times, all CPUs)."""

    cpus: int
    busy_s: float = 0.0
    idle_s: float = 0.0
    steal_s: float = 0.0
    load_1m: list[float] = field(default_factory=list)


def _cpu_totals() -> tuple[float, float, float]:
    t = psutil.cpu_times()
    steal = getattr(t, "steal", 0.0)
    idle = t.idle + getattr(t, "iowait", 0.0)
    busy = sum(t) - idle - steal - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
    return busy, idle, steal


def watch(argv: list[str], interval_s: float) -> tuple[int, dict[int, ProcessRecord], Machine]:
    """Run ``argv`` and sample its process tree every ``interval_s`` until it exits."""
    start = time.monotonic()
    b0, i0, s0 = _cpu_totals()
    child = subprocess.Popen(argv)
    root = psutil.Process(child.pid)
    records: dict[int, ProcessRecord] = {}
    machine = Machine(cpus=psutil.cpu_count() or 0)
    while True:
        t_s = time.monotonic() - start
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        for proc in tree:
            try:
                rec = records.get(proc.pid)
                if rec is None:
                    rec = records[proc.pid] = ProcessRecord(proc.pid, role_of(proc.cmdline()), t_s)
                rec.sample(proc, t_s)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        machine.load_1m.append(round(psutil.getloadavg()[0], 2))
        if child.poll() is not None:
            break
        time.sleep(interval_s)
    b1, i1, s1 = _cpu_totals()
    machine.busy_s, machine.idle_s, machine.steal_s = b1 - b0, i1 - i0, s1 - s0
    return child.returncode, records, machine


def by_role(records: dict[int, ProcessRecord]) -> dict[str, dict[str, Any]]:
    """Per role: processes, CPU seconds, run-queue wait (all threads and main threads), the
    wait per CPU second, and involuntary switches.

    >>> a = ProcessRecord(1, "task host", 0.0, 2.0, cpu_s=1.0, wait_s=0.1,
    ...                   main_thread_wait_s=0.05, main_thread_cpu_s=0.8, involuntary_switches=10)
    >>> b = ProcessRecord(2, "task host", 0.0, 2.0, cpu_s=3.0, wait_s=0.3,
    ...                   main_thread_wait_s=0.15, main_thread_cpu_s=2.2, involuntary_switches=30)
    >>> r = by_role({1: a, 2: b})["task host"]
    >>> (r["processes"], r["cpu_s"], r["wait_s"], r["wait_per_cpu_s"], r["main_wait_per_cpu_s"])
    (2, 4.0, 0.4, 0.1, 0.0667)
    """
    out: dict[str, dict[str, Any]] = {}
    for role in sorted({r.role for r in records.values()}):
        rs = [r for r in records.values() if r.role == role]
        cpu = sum(r.cpu_s for r in rs)
        waits = [r.wait_s for r in rs if r.wait_s is not None]
        mains = [r for r in rs if r.main_thread_wait_s is not None]
        main_wait = sum(r.main_thread_wait_s or 0.0 for r in mains)
        main_cpu = sum(r.main_thread_cpu_s or 0.0 for r in mains)
        out[role] = {
            "processes": len(rs),
            "cpu_s": round(cpu, 3),
            "wait_s": round(sum(waits), 4) if waits else None,
            "wait_per_cpu_s": round(sum(waits) / cpu, 4) if waits and cpu > 0 else None,
            "main_wait_s": round(main_wait, 4) if mains else None,
            "main_wait_per_cpu_s": (
                round(main_wait / main_cpu, 4) if mains and main_cpu > 0 else None
            ),
            "involuntary_switches": sum(r.involuntary_switches for r in rs),
            "voluntary_switches": sum(r.voluntary_switches for r in rs),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="results JSON")
    ap.add_argument("--interval-s", type=float, default=0.2, help="seconds between samples")
    ap.add_argument("--note", default="", help="what to say about the machine or the run")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("name the command to run after --")
    if not args.interval_s > 0:
        ap.error(f"--interval-s {args.interval_s} must be > 0")
    started = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = time.monotonic()
    try:
        rc, records, machine = watch(command, args.interval_s)
    except OSError as exc:  # no such program, not executable
        ap.error(f"cannot run {command[0]!r}: {exc.strerror or exc}")
    wall = time.monotonic() - t0
    total = machine.busy_s + machine.idle_s + machine.steal_s
    record = {
        "benchmark": "run_queue",
        "command": command_line(),
        "date": started,
        "note": args.note,
        "machine": {"cpu_model": cpu_model(), "cpus": machine.cpus},
        "returncode": rc,
        "wall_s": round(wall, 2),
        "interval_s": args.interval_s,
        "cpu": {
            "busy_frac": round(machine.busy_s / total, 4) if total else None,
            "steal_frac": round(machine.steal_s / total, 4) if total else None,
            "load_1m_max": max(machine.load_1m, default=None),
        },
        "roles": by_role(records),
        "processes": [asdict(r) for r in sorted(records.values(), key=lambda r: r.pid)],
    }
    write_results(record, args.out)
    return rc


if __name__ == "__main__":
    sys.exit(main())
