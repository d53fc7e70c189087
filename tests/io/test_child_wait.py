"""``wait_exit``: the exit code of a child once it ends, None while it runs, and no polling in
between (a process that watches a run for its whole length must not wake up every few ms on
the cores the ranks train on)."""

from __future__ import annotations

import subprocess
import sys

import psutil

from freeride_lab.io.child_wait import wait_exit


def child(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


def test_returns_the_exit_code_of_a_child_that_ends_and_reaps_it() -> None:
    proc = child("import sys; sys.exit(3)")
    assert wait_exit(proc, 60.0) == 3
    assert proc.returncode == 3
    assert wait_exit(proc, 0.0) == 3  # asked again after it was reaped


def test_returns_none_while_the_child_still_runs() -> None:
    proc = child("import time; time.sleep(60)")
    try:
        assert wait_exit(proc, 0.2) is None
        assert proc.returncode is None
    finally:
        proc.kill()
        proc.wait()


def test_waits_without_polling() -> None:
    proc = child("import time; time.sleep(60)")
    me = psutil.Process()
    try:
        before = me.num_ctx_switches().voluntary
        assert wait_exit(proc, 0.5) is None
        woken = me.num_ctx_switches().voluntary - before
    finally:
        proc.kill()
        proc.wait()
    # Popen.wait(0.5) wakes up about 14 times (1, 2, 4, ... 50 ms sleeps between waitpid calls)
    assert woken <= 4, f"{woken} wake-ups in one 0.5 s wait"
