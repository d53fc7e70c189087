"""``exit_now``: end this process at once, its logs and output flushed, skipping teardown.

Ranks, the launcher, torchrun, side-task workers and task processes have imported torch by the
time they end, and the interpreter's teardown of torch's modules takes seconds of CPU on a
small, busy box, while a stopped run is not over until its whole process tree has gone. Each
of them calls ``exit_now`` once its end is recorded (events closed, children reaped), so
nothing is left to tear down but memory (see [Note: fast exit] in ``pipeline.rank``).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

__all__ = ["exit_now"]


def exit_now(code: int) -> NoReturn:
    """Flush the logging handlers, stdout and stderr, then ``os._exit(code)``."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
