"""``BackgroundThread``: one daemon thread that runs a loop until it is told to stop.

The GPU sampler, the governor's control loop and a worker's watchdog each run a periodic loop
in a daemon thread that a ``stop()`` ends (from any thread, the loop's own included). Each
start hands the loop a fresh stop event, so a loop that outlived a ``stop()`` timeout never
comes back to life when the owner starts again. A ``with`` block starts the loop and stops it.

>>> import threading
>>> ticks = []
>>> def loop(stop: threading.Event) -> None:
...     while not stop.is_set():
...         ticks.append(1)
...         stop.wait(0.01)
>>> thread = BackgroundThread(loop, name="example").start()
>>> thread.running
True
>>> thread.stop()
>>> thread.running, len(ticks) > 0
(False, True)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Self

__all__ = ["BackgroundThread"]


class BackgroundThread:
    """Runs ``loop(stop_event)`` in a daemon thread called ``name``, from ``start`` to ``stop``."""

    def __init__(self, loop: Callable[[threading.Event], None], *, name: str) -> None:
        self._loop = loop
        self.name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """True while the loop's thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> BackgroundThread:
        """Start the loop unless it runs; returns at once."""
        if not self.running:
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._loop, args=(self._stop,), name=self.name, daemon=True
            )
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Tell the loop to stop and wait up to ``timeout_s`` for it (not from the loop's own
        thread). Idempotent."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
