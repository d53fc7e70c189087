"""How a training rank stops: SIGINT ignored, SIGTERM graceful, and a bounded exit."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)


def _run(code: str, *, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_a_rank_whose_close_blocks_still_exits_with_its_recorded_code() -> None:
    """Closing the process group can block when the launcher took the store along; the rank
    has recorded its end by then and must leave anyway, with the code it decided on."""
    done = _run(
        """
        import threading
        from freeride_lab.pipeline.stop import StopControl
        stop = StopControl()
        stop.install()
        stop.done()
        stop.exit_within(0.5, code=0)
        threading.Event().wait()  # a close that never returns
        """
    )
    assert done.returncode == 0, done.stderr
    assert "still closing" in done.stderr


def test_a_failed_rank_keeps_code_1_when_it_has_to_be_cut_short() -> None:
    done = _run(
        """
        import threading
        from freeride_lab.pipeline.stop import StopControl
        stop = StopControl()
        stop.exit_within(0.5, code=1)
        threading.Event().wait()
        """
    )
    assert done.returncode == 1, done.stderr


def test_sigterm_asks_for_a_graceful_stop_and_sigint_is_ignored() -> None:
    done = _run(
        f"""
        import os, signal, time
        from freeride_lab.pipeline.stop import StopControl
        stop = StopControl(grace_s=30)
        stop.install()
        os.kill(os.getpid(), {int(signal.SIGINT)})
        time.sleep(0.2)
        assert not stop.requested.is_set()
        os.kill(os.getpid(), {int(signal.SIGTERM)})
        assert stop.requested.wait(5)
        stop.done()
        print(stop.reason)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "SIGTERM"


def test_a_stop_not_honoured_within_its_grace_aborts_with_code_1() -> None:
    done = _run(
        """
        import threading
        from freeride_lab.pipeline.stop import StopControl
        stop = StopControl(grace_s=0.3)
        stop.install()
        stop.on_abort = lambda message: print("aborted:", message, flush=True)
        stop.request("test")
        threading.Event().wait()  # the step never ends
        """
    )
    assert done.returncode == 1
    assert "aborted: stopped by test" in done.stdout


def test_a_sigterm_that_lands_while_a_stop_is_being_recorded_does_not_deadlock() -> None:
    """The launcher's death signal can arrive while the main thread is inside ``request`` (a
    second SIGTERM, a kill right before the launcher died): the rank must still stop."""
    done = _run(
        f"""
        import os, threading
        from freeride_lab.pipeline import stop as stop_module
        stop = stop_module.StopControl(grace_s=30)
        stop.install()

        class SignalledThread(threading.Thread):  # SIGTERM lands inside request()'s lock
            def __init__(self, *args, **kwargs):
                os.kill(os.getpid(), {int(signal.SIGTERM)})
                for _ in range(1000):  # bytecodes: the pending handler runs here
                    pass
                super().__init__(*args, **kwargs)

        stop_module.threading.Thread = SignalledThread
        stop.request("first")
        stop.done()
        print(stop.reason)
        """,
        timeout_s=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "first"


def test_every_rank_learns_of_a_stop_one_step_after_it_is_raised() -> None:
    """The agreement runs behind the step: a request raised before step k stops the ranks
    before step k + 1, and a poll never waits on the device."""
    done = _run(
        """
        import torch.distributed as dist
        from freeride_lab.pipeline.stop import StopAgreement
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        agreement = StopAgreement()
        seen = [agreement.poll(False), agreement.poll(True), agreement.poll(False)]
        agreement.finish()
        print(seen)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[False, False, True]"
