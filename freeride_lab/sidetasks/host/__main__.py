"""``python -m freeride_lab.sidetasks.host``: run one side task's process (see ``host.entry``)."""

from __future__ import annotations

from freeride_lab.io.fast_exit import exit_now
from freeride_lab.sidetasks.host.entry import main

if __name__ == "__main__":
    # [Note: fast exit] as the ranks and the worker do: the end is recorded, and skipping the
    # interpreter's teardown of torch's modules lets the process go at once
    exit_now(main())
