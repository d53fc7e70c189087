"""The side-task API users write against: ``IterativeSideTask`` and ``ImperativeSideTask``.

Lifecycle (FreeRide's states; the transitions themselves live in ``core.sidetask_state``)::

    SUBMITTED --setup()--> CREATED --to_device()--> PAUSED <--on_start()/on_pause()--> RUNNING
    PAUSED/RUNNING --preempt: to_host()--> CREATED         RUNNING --is_finished()--> FINISHED
    any --stop: teardown()--> STOPPED                       any error: teardown() --> FAILED

An iterative task does one unit of work per ``step()`` and is only stepped while the current
bubble has room for its budget. An imperative task runs its own loop in ``run()``; the framework
pauses it at bubble end and resumes it at bubble start: cooperatively at the next
``pause_point()`` the loop calls, and by stopping the whole process (SIGSTOP/SIGCONT, sent by the
worker) in any case.

Both can ``state_dict()``/``load_state_dict()`` so that detach, re-attach and preemption lose no
progress. Tasks are referenced by import path (``"pkg.module:Class"``) or file path
(``"path/to/file.py:Class"``) because spawned processes cannot unpickle notebook classes.
"""

from __future__ import annotations

import sys
from typing import Any, ClassVar, Protocol

from freeride_lab.sidetasks.host_copy import host_copies

__all__ = [
    "ImperativeSideTask",
    "IterativeSideTask",
    "SideTaskBase",
    "TaskStopped",
    "doubling_sizes",
    "host_copies",
]


def doubling_sizes(most: int) -> tuple[int, ...]:
    """Step sizes 1, 2, 4, ... up to ``most`` (``IterativeSideTask.step_sizes``; ``(1,)`` for
    a ``most`` below 2).

        >>> doubling_sizes(4), doubling_sizes(3), doubling_sizes(1)
        ((1, 2, 4), (1, 2), (1,))
    """
    return tuple(2**j for j in range(max(most, 1).bit_length()))


class TaskStopped(Exception):
    """Raised by ``ImperativeSideTask.pause_point()`` when the task is being stopped."""


class _Controller(Protocol):
    """What the task host plugs into an imperative task."""

    def report(self, progress: float) -> None: ...

    def pause_point(self) -> None: ...


class SideTaskBase:
    """Hooks shared by both kinds of side task. Options arrive as keyword arguments."""

    #: Progress unit reported by ``step()``/``progress``: "samples", "iterations", "images", …
    unit: ClassVar[str] = "iterations"

    #: Optional: this task's throughput on the cost model's reference GPU (FreeRide's is an
    #: RTX 3080), in ``unit`` per second. A custom task that declares it gets FreeRide's cost
    #: saving (``Session.cost_saving()`` and the report) like the built-ins do; None leaves
    #: it out of cost accounting. Must be a finite number > 0.
    reference_throughput: ClassVar[float | None] = None

    #: True when ``state_dict()`` returns copies that later steps do not change (host copies
    #: of tensors, not the live ones): a periodic checkpoint is then written as it is, from a
    #: writer thread, while the task steps on; otherwise the host copies its tensors first
    #: (``sidetasks.host.checkpoints`` [Note: periodic checkpoints in the background]).
    state_dict_is_copy: ClassVar[bool] = False

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.device: str = "cpu"
        self.progress: float = 0.0  # total units done, restored from checkpoints

    # SUBMITTED -> CREATED: build data, model and optimizer in host memory.
    def setup(self) -> None:
        """Host-side set-up (data, model, optimizer). No device work yet."""

    # CREATED -> PAUSED: state onto the device.
    def to_device(self, device: str) -> None:
        """Move state onto ``device`` (the default moves every ``torch.nn.Module`` attribute)."""
        self.device = device
        _move_modules(self, device)

    # PAUSED/RUNNING -> CREATED: state off the device (preemption).
    def to_host(self) -> None:
        """Move state off the device and release cached device memory."""
        was = self.device
        _move_modules(self, "cpu")
        self.device = "cpu"
        torch = sys.modules.get("torch")
        if torch is not None and was.startswith("cuda"):
            torch.cuda.empty_cache()

    def on_start(self) -> None:
        """PAUSED -> RUNNING."""

    def on_pause(self) -> None:
        """RUNNING -> PAUSED."""

    def is_finished(self) -> bool:
        """True once the task has nothing left to do."""
        return False

    def teardown(self) -> None:
        """Release resources on STOPPED/FINISHED/FAILED."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: by default ``progress`` and module/optimizer states."""
        return {"progress": self.progress, **_module_states(self)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.progress = float(state.get("progress", 0.0))
        _load_module_states(self, state)


class IterativeSideTask(SideTaskBase):
    """A side task made of short steps; the worker calls ``step()`` only inside bubbles."""

    def step(self) -> float:
        """Do one unit of work on ``self.device``; return the progress made (in ``unit``).

        A task whose ``step_sizes`` offers more than ``(1,)`` is called as ``step(size)`` for
        any size above 1, so its ``step`` takes ``size: int = 1``.
        """
        raise NotImplementedError

    @property
    def step_sizes(self) -> tuple[int, ...]:
        """The sizes of step the task can take next, ascending, counted in its smallest step.

        The default ``(1,)``: every step is alike. A task that can also take a few of its
        smallest steps as one (slices of a batch, say) lists those counts, and the host takes,
        in each bubble, the largest whose time still fits what is left of it (see
        ``host.iterative`` [Note: step sizes]).
        """
        return (1,)

    @property
    def warmup_steps(self) -> int:
        """Steps at the start on a device whose time says nothing of the task's pace (a
        compilation, a graph capture); the host's profile leaves them out, and always at
        least the first (``host.accounting`` [Note: profiling in bubbles]). Default 0."""
        return 0


class ImperativeSideTask(SideTaskBase):
    """A side task with its own loop; the framework pauses and resumes the whole process."""

    _controller: _Controller | None = None  # set by the task host

    def run(self) -> None:
        """The free-running loop; returning means FINISHED.

        Call ``self.report(progress)`` as work completes and ``self.pause_point()`` between
        units of work, so that pauses and checkpoints fall on clean boundaries.
        """
        raise NotImplementedError

    def report(self, progress: float) -> None:
        """Record ``progress`` units of work just done."""
        self.progress += progress
        if self._controller is not None:
            self._controller.report(progress)

    def pause_point(self) -> None:
        """Return at once while running; block while paused.

        Raises:
            TaskStopped: the task is being stopped; let it propagate out of ``run()``.
        """
        if self._controller is not None:
            self._controller.pause_point()


def _modules(obj: object) -> dict[str, Any]:
    torch = sys.modules.get("torch")
    if torch is None:  # nothing imported torch, so nothing here can be a module or optimizer
        return {}
    return {
        k: v for k, v in vars(obj).items() if isinstance(v, torch.nn.Module | torch.optim.Optimizer)
    }


def _move_modules(obj: object, device: str) -> None:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    for name, value in list(vars(obj).items()):
        if isinstance(value, torch.nn.Module):
            value.to(device)
        elif isinstance(value, torch.Tensor):
            setattr(obj, name, value.to(device))
        elif isinstance(value, torch.optim.Optimizer):
            for state in value.state.values():
                for k, v in state.items():
                    if isinstance(v, torch.Tensor):
                        state[k] = v.to(device)


def _module_states(obj: object) -> dict[str, Any]:
    return {f"module:{k}": v.state_dict() for k, v in _modules(obj).items()}


def _load_module_states(obj: object, state: dict[str, Any]) -> None:
    for k, v in _modules(obj).items():
        if f"module:{k}" in state:
            v.load_state_dict(state[f"module:{k}"])
