"""torchrun with a fast exit: ``python -m freeride_lab.pipeline.torchrun ARGS`` runs
``torch.distributed.run`` with ``ARGS`` and leaves without the interpreter's teardown.

torchrun has imported torch; tearing its modules down takes seconds of CPU on a small, busy
box, and a stopped run is not over until torchrun has gone (``Session.stop()`` waits for the
whole tree). By the time ``torch.distributed.run.main`` returns or raises, torchrun has waited
for its ranks and closed its log tails, so nothing is left to tear down but memory: the exit
code and the output are those of ``python -m torch.distributed.run`` (0, the ``SystemExit``
code, or 1 after printing the traceback). See [Note: fast exit] in ``pipeline.rank``.

A stop (``Session.stop()``: SIGTERM to the launcher's tree) reaches torchrun as a signal; its
handler sends it on to the ranks and raises ``SignalException``, which is how a stop looks,
not a crash: one line in torchrun's log and the shell's status for a death by that signal
(128 + its number), not a traceback.
"""

from __future__ import annotations

import signal
import sys
import traceback
from collections.abc import Sequence

from freeride_lab.io.fast_exit import exit_now

__all__ = ["main"]


def _exit_code(exc: SystemExit) -> int:
    """The status Python gives ``SystemExit(code)``: None is 0, an int is itself, else 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)  # what Python does with a message
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run torchrun's ``main`` on ``argv`` (default ``sys.argv[1:]``); its exit status."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return _exit_code(exc)
    except SignalException as exc:
        name = signal.Signals(exc.sigval).name
        print(f"torchrun: stopped by {name}, sent on to its ranks", file=sys.stderr)
        return 128 + int(exc.sigval)
    except Exception:
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    exit_now(main())
