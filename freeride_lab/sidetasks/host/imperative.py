"""``ImperativeDriver``: runs an ``ImperativeSideTask``'s own loop behind a gate.

The task host owns one per imperative task::

    driver = ImperativeDriver(task, on_report=record, on_exit=wake_host)
    driver.resume()      # bubble start: open the gate (the first call starts run() in a thread)
    driver.pause()       # bubble end: close it; run() blocks at its next pause_point()
    driver.quiesce(5.0)  # stopping: pause_point() raises TaskStopped, wait for run() to leave

The gate only covers the task's cooperative pause points. Between them ``run()`` keeps going
until the worker stops the whole process with SIGSTOP (paper notes §6.2): the gate gives clean
checkpoints, the signal gives the guarantee.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable

from freeride_lab.sidetasks.api import ImperativeSideTask, TaskStopped

log = logging.getLogger(__name__)

__all__ = ["ImperativeDriver"]


class ImperativeDriver:
    """Gate, thread and outcome of one imperative task's ``run()``.

    Args:
        on_report: called with each ``report(progress)`` of the task, in its thread.
        on_exit: called once ``run()`` has returned or raised, in its thread.
    """

    def __init__(
        self,
        task: ImperativeSideTask,
        *,
        on_report: Callable[[float], None],
        on_exit: Callable[[], None],
    ) -> None:
        self.task = task
        self.error: tuple[BaseException, str] | None = None  # (exception, traceback)
        self.parked = False  # run() waits in pause_point(): a clean moment for a checkpoint
        self._on_report = on_report
        self._on_exit = on_exit
        self._gate = threading.Event()
        self._stopping = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        task._controller = self

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def finished(self) -> bool:
        """``run()`` returned by itself (not stopped, no error)."""
        return self._done.is_set() and self.error is None and not self._stopping.is_set()

    @property
    def done(self) -> bool:
        """``run()`` has left, for whatever reason."""
        return self._done.is_set()

    def resume(self) -> None:
        """Open the gate; the first call starts ``run()``."""
        self._gate.set()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="task-run", daemon=True)
            self._thread.start()

    def pause(self) -> None:
        """Close the gate: ``run()`` blocks at its next ``pause_point()``."""
        self._gate.clear()

    def quiesce(self, timeout_s: float) -> None:
        """Make ``run()`` leave at its next pause point and wait up to ``timeout_s`` for it."""
        self._stopping.set()
        self._gate.set()
        thread = self._thread
        if thread is None:
            return
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning(
                "run() reached no pause_point() within %.0f s; its checkpoint may be mid-update",
                timeout_s,
            )

    # -- what the task calls (sidetask._Controller) --

    def report(self, progress: float) -> None:
        self._on_report(progress)

    def pause_point(self) -> None:
        if self._stopping.is_set():
            raise TaskStopped
        if not self._gate.is_set():
            self.parked = True
            self._gate.wait()
            self.parked = False
        if self._stopping.is_set():
            raise TaskStopped

    def _run(self) -> None:
        try:
            self.task.run()
        except TaskStopped:
            pass
        except BaseException as exc:
            self.error = (exc, traceback.format_exc())
        finally:
            self._done.set()
            self._on_exit()
