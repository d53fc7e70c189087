"""Device memory of the built-in side tasks: moving off the device gives the memory back.

A task that moves its own tensors (rather than relying on ``SideTaskBase``'s module walk)
still owes training the memory it held: after ``to_host`` or ``teardown`` the CUDA caching
allocator's blocks go back to the device, or the next bubble's training step would find them
taken. ``HostReturningTask`` gives the built-ins one ``to_host`` and one ``teardown``;
``releasing_device_cache`` wraps any other step that drops device tensors.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

import torch

from freeride_lab.sidetasks.api import IterativeSideTask

__all__ = ["HostReturningTask", "releasing_device_cache"]


@contextmanager
def releasing_device_cache(device: str) -> Iterator[None]:
    """Run the body, then release the CUDA allocator's cached blocks if ``device`` is a GPU.

    ``device`` is read before the body, which usually moves or drops the tensors that were on it.
    """
    was_cuda = torch.device(device).type == "cuda"
    yield
    if was_cuda:
        torch.cuda.empty_cache()


class HostReturningTask(IterativeSideTask):
    """An iterative task whose ``to_device`` moves all its state: ``to_host`` is
    ``to_device("cpu")`` followed by the release of the device's cached blocks, and
    ``teardown`` drops the attributes named in ``_dropped`` and releases them the same way."""

    #: Attributes holding the task's data, model and buffers: ``teardown`` sets them to None.
    _dropped: ClassVar[tuple[str, ...]] = ()

    def to_host(self) -> None:
        """Move everything back to host memory and release the device's cached blocks."""
        with releasing_device_cache(self.device):
            self.to_device("cpu")

    def teardown(self) -> None:
        """Drop the ``_dropped`` attributes and release the device's cached blocks."""
        with releasing_device_cache(self.device):
            for name in self._dropped:
                setattr(self, name, None)
