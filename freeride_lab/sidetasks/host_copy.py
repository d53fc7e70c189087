"""A task's state copied into host memory (``host_copies``), and copies left in flight for a
thread to wait for (``copies_in_flight``).

# [Note: host copies in pinned memory]
A GPU tensor is copied into page-locked host memory, all of them queued before one wait: a
copy into pageable memory is staged by the driver and waited for tensor by tensor, and the host
memory is faulted in page by page. VGG-19's weights and Adam state (1.7 GB) took 1.24 s that
way on an H100 host, and the task's host reads no edge while it copies. Pinned blocks come from
torch's caching host allocator, so a task's next checkpoint reuses the ones its last one freed,
and the task process keeps about its state's size pinned (where pinning fails, the copy is made
as before, and the process's log says so once, with the reason: such a copy holds the host
tensor by tensor again).

# [Note: copies left in flight]
Queued and waited for on the host's thread, VGG-19's state still held its host 32 ms at every
periodic checkpoint: bubbles the task (and the stage's leftovers task, which reads the
hand-ons) did not take. Inside ``copies_in_flight()`` ``host_copies`` queues its copies,
records an event on each device's stream and returns at once; the ``CopiesInFlight`` it
yields waits for them. The host's writer thread waits before it serialises the state, and the
host itself before the task's next state change (``HostBase._apply``), so no step, on whatever
stream the task runs it, changes a tensor whose copy is still being read. What
``host_copies`` returns in there holds its bytes only after that wait: a ``state_dict()``
returns its copies, it does not read them.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["CopiesInFlight", "copies_in_flight", "host_copies"]

_local = threading.local()  # .in_flight: the CopiesInFlight of the innermost copies_in_flight()


class CopiesInFlight:
    """The copies ``host_copies`` queued inside one ``copies_in_flight()``: an event per
    device stream they were queued on ([Note: copies left in flight])."""

    def __init__(self) -> None:
        self._events: list[Any] = []

    def __bool__(self) -> bool:
        """Whether any copy was queued."""
        return bool(self._events)

    def _add(self, event: Any) -> None:
        self._events.append(event)

    def wait(self) -> None:
        """Block until every queued copy has finished; any thread may call it, and again (a
        finished copy's event returns at once)."""
        for event in self._events:
            event.synchronize()


@contextlib.contextmanager
def copies_in_flight() -> Iterator[CopiesInFlight]:
    """Within it, this thread's ``host_copies`` calls return without waiting for their GPU
    copies; the ``CopiesInFlight`` yielded waits for them ([Note: copies left in flight]).

        >>> with copies_in_flight() as copies:
        ...     state = host_copies({"step": 3})
        >>> state, bool(copies)   # nothing on a GPU: nothing in flight
        ({'step': 3}, False)
    """
    outer = getattr(_local, "in_flight", None)
    copies = CopiesInFlight()
    _local.in_flight = copies
    try:
        yield copies
    finally:
        _local.in_flight = outer


def host_copies(state: Any) -> Any:
    """``state`` with every tensor a detached copy in host memory (numpy arrays copied too)
    and its dicts, lists and tuples rebuilt; other values as they are. A ``state_dict()`` that
    returns this may declare ``state_dict_is_copy``: no later step changes what it holds.
    GPU tensors go through pinned memory ([Note: host copies in pinned memory]); inside
    ``copies_in_flight()`` their copies are left in flight ([Note: copies left in flight]).

        >>> live = {"step": 3, "seen": [1, 2]}
        >>> copy = host_copies(live)
        >>> copy == live and copy["seen"] is not live["seen"]
        True
    """
    torch = sys.modules.get("torch")
    queued: set[Any] = set()  # the CUDA devices whose copies are in flight
    copy = _host_copies(state, torch, sys.modules.get("numpy"), queued)
    in_flight: CopiesInFlight | None = getattr(_local, "in_flight", None)
    for device in queued:
        stream = torch.cuda.current_stream(device)  # type: ignore[union-attr]
        if in_flight is None:
            stream.synchronize()
        else:
            event = torch.cuda.Event()  # type: ignore[union-attr]
            event.record(stream)
            in_flight._add(event)
    return copy


def _host_copies(state: Any, torch: Any, numpy: Any, queued: set[Any]) -> Any:
    """``host_copies`` of ``state``; a CUDA tensor's copy is queued on its device's current
    stream, noted in ``queued`` (the caller waits for them)."""
    if torch is not None and isinstance(state, torch.Tensor):
        tensor = state.detach()
        if tensor.is_cuda:
            try:
                pinned = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            except RuntimeError as exc:  # no page-locked memory to be had: a plain copy
                _unpinned(exc, tensor.nbytes)
                return tensor.to("cpu", copy=True)
            queued.add(tensor.device)
            return pinned.copy_(tensor, non_blocking=True)
        return tensor.to("cpu", copy=True)
    if numpy is not None and isinstance(state, numpy.ndarray):
        return state.copy()
    if isinstance(state, dict):
        return type(state)((k, _host_copies(v, torch, numpy, queued)) for k, v in state.items())
    if isinstance(state, tuple) and hasattr(state, "_fields"):  # a named tuple
        return type(state)(*(_host_copies(v, torch, numpy, queued) for v in state))
    if isinstance(state, list | tuple):
        return type(state)(_host_copies(v, torch, numpy, queued) for v in state)
    return state


_said_unpinned = False  # the process's log has said why a copy could not be pinned


def _unpinned(exc: BaseException, nbytes: int) -> None:
    """Log, once per process, that a GPU tensor's copy could not be pinned, and why."""
    global _said_unpinned
    if not _said_unpinned:
        _said_unpinned = True
        log.warning(
            "host_copies: no page-locked memory for a %d-byte copy (%s); copying through "
            "pageable memory, waited for tensor by tensor",
            nbytes,
            exc,
        )
