"""The side-task host: one side task in its own process (``python -m freeride_lab.sidetasks.host``).

- ``task_host``: ``TaskHost``, the main loop, the worker's commands and the imperative glue;
- ``base``: the host's links to the outside world and its state machine;
- ``iterative``: steps of an iterative task in bubbles; ``imperative``: the gate and thread
  behind an imperative task's ``run()``;
- ``accounting``: step events, the profile and the overrun policy;
- ``checkpoints``: the checkpoint file and when it is written;
- ``entry``: the process entry point.
"""

from __future__ import annotations

from freeride_lab.sidetasks.host.checkpoints import load_checkpoint, save_checkpoint
from freeride_lab.sidetasks.host.entry import main
from freeride_lab.sidetasks.host.task_host import TaskHost

__all__ = ["TaskHost", "load_checkpoint", "main", "save_checkpoint"]
