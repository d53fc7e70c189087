"""``python -m freeride_lab.sidetasks.host``: run one side task's process (see ``host.entry``)."""

from __future__ import annotations

import logging
import os
import sys

from freeride_lab.sidetasks.host.entry import main

if __name__ == "__main__":
    # [Note: fast exit] as the ranks and the worker do: the end is recorded, and skipping the
    # interpreter's teardown of torch's modules lets the process go at once
    exit_code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
