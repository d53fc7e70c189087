"""``RuntimeOptions``: how a run's ranks run (what ``RunConfig``'s other fields leave open).

They change how the runtime behaves, not what is trained: where live bubble edges go, how long
a stop and a collective may take, whether stages are timed, and single-GPU emulate mode. They
are typed and checked here, in one place, when a ``RunConfig`` is built (run.json stores them
under ``"runtime"``); the ranks only read them.

    >>> RuntimeOptions(stop_grace_s=5).stop_grace_s
    5.0
    >>> RuntimeOptions.from_dict({"timed": "alternate", "alternate_every": 2}).alternate_every
    2
    >>> RuntimeOptions(timed="sometimes")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: runtime timed='sometimes' must be True, False or 'alternate' ...
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "OUTLIVED",
    "PREDICTORS",
    "RUNTIME_KEYS",
    "EmulateOptions",
    "ReplayCosts",
    "RuntimeOptions",
    "TimedMode",
    "replay_costs",
]

TimedMode = bool | Literal["alternate"]
MAX_SECONDS = 3600.0  # stop_grace_s and pg_timeout_s: beyond an hour a value is a typo
MAX_ALTERNATE_EVERY = 10**6
MAX_ANNOUNCE_MIN_MS = 1e6
#: A step group longer than this would outlast most bubbles it could start in.
MAX_STEP_GROUP_MS = 100.0
#: How a rank predicts bubble lengths (``RuntimeOptions.predictor``).
PREDICTORS: tuple[str, ...] = ("min", "feedback", "peers")
#: What a side task does once a bubble outlives its predicted end (``RuntimeOptions.outlived``).
OUTLIVED: tuple[str, ...] = ("stop", "survivors", "hand-on")
_REF = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def _is_int(value: Any) -> bool:
    """An ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def _unknown_keys(what: str, data: dict[str, Any], cls: type) -> None:
    """ValueError naming the keys of ``data`` that ``cls`` has no field for, and the valid ones."""
    names = sorted(f.name for f in dataclasses.fields(cls))
    unknown = sorted(str(k) for k in set(data) - set(names))
    if unknown:
        raise ValueError(f"unknown {what} key(s) {unknown}; valid: {', '.join(names)}")


@dataclass(frozen=True, kw_only=True)
class ReplayCosts:
    """One rank's costs, in ms, for an emulation to replay instead of its own calibration
    (``EmulateOptions.costs``): a calibration report as a run records it.

    Args:
        rank: the rank these costs are for.
        forward_ms, backward_ms, weight_ms: per chunk of the rank, F, the whole backward, and
            the part of it a zero-bubble schedule runs as W (0 where it never splits).
        optimizer_ms: the rank's optimizer step.
    """

    rank: int
    forward_ms: tuple[float, ...]
    backward_ms: tuple[float, ...]
    weight_ms: tuple[float, ...]
    optimizer_ms: float

    def __post_init__(self) -> None:
        if not _is_int(self.rank) or self.rank < 0:
            raise ValueError(f"replayed costs rank={self.rank!r} must be an integer >= 0")
        lists = {n: getattr(self, n) for n in ("forward_ms", "backward_ms", "weight_ms")}
        for name, values in lists.items():
            if (
                not isinstance(values, list | tuple)
                or not values
                or not all(_is_ms(v) for v in values)
            ):
                raise ValueError(
                    f"replayed costs of rank {self.rank}: {name}={values!r} must be a non-empty "
                    "list of milliseconds >= 0, one a chunk"
                )
            object.__setattr__(self, name, tuple(float(v) for v in values))
        if len({len(v) for v in lists.values()}) != 1:
            raise ValueError(
                f"replayed costs of rank {self.rank}: forward_ms, backward_ms and weight_ms "
                "need one value a chunk each"
            )
        if any(w > b for w, b in zip(self.weight_ms, self.backward_ms, strict=True)):
            raise ValueError(
                f"replayed costs of rank {self.rank}: weight_ms={list(self.weight_ms)} is part "
                f"of the backward and cannot pass backward_ms={list(self.backward_ms)}"
            )
        if not _is_ms(self.optimizer_ms):
            raise ValueError(
                f"replayed costs of rank {self.rank}: optimizer_ms={self.optimizer_ms!r} must "
                "be milliseconds >= 0"
            )
        object.__setattr__(self, "optimizer_ms", float(self.optimizer_ms))

    @classmethod
    def from_report(cls, data: Mapping[str, Any]) -> ReplayCosts:
        """From a calibration report (``Emulation.calibrate``, a bench result's
        ``runs[].calibration``); keys beyond the costs (device, what was measured) are left."""
        try:
            return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})
        except (KeyError, TypeError) as exc:
            raise ValueError(
                f"a calibration report needs rank, forward_ms, backward_ms, weight_ms and "
                f"optimizer_ms; got keys {sorted(data) if isinstance(data, Mapping) else data!r}"
            ) from exc


def _is_ms(value: Any) -> bool:
    """A finite number of milliseconds >= 0 (not a ``bool``)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and math.isfinite(value) and value >= 0


def replay_costs(costs: Any) -> tuple[ReplayCosts, ...]:
    """``costs`` (``ReplayCosts`` or calibration reports as dicts, one a rank in rank order
    from 0) as ``ReplayCosts``; ValueError naming what is wrong."""
    if not isinstance(costs, list | tuple):
        raise ValueError(f"emulate costs={costs!r} must be a list, one entry a rank")
    out = tuple(c if isinstance(c, ReplayCosts) else ReplayCosts.from_report(c) for c in costs)
    if [c.rank for c in out] != list(range(len(out))):
        raise ValueError(
            f"emulate costs for ranks {[c.rank for c in out]}: need one a rank, in rank order "
            "from 0"
        )
    return out


@dataclass(frozen=True, kw_only=True)
class EmulateOptions:
    """Single-GPU emulate mode (``pipeline.emulate``): every rank builds its real chunk on one
    device, one rank computes per step and the others sleep its calibrated costs.

    Args:
        device: where a real rank computes: "cuda", "cuda:<i>" or "cpu".
        d_model, heads: width and heads of the real model (``RunConfig.d_model`` is the wire
            width, see ``pipeline.emulate`` [Note: wire width]); d_model must be a multiple
            of ``RunConfig.d_model``.
        dtype: "bfloat16" or "float32" for the real chunks.
        calibrate_warmup, calibrate_iters: untimed and timed micro-batches per chunk.
        loss_on: where a real last stage computes its loss. "device" (the default): its
            logits stay on the device and the loss runs there, as in a GPU pipeline. "host":
            its logits come back to the host and the loss runs on the CPU, which makes the
            last stage host-bound (kept to measure what the device loss changes).
        costs: every rank's costs to replay (``ReplayCosts``, or calibration reports as dicts),
            one per rank, in place of what this run's calibration measures (it still runs, and
            its report keeps what it measured): two runs that replay the same costs have peers
            that sleep alike, so their bubbles are alike. () calibrates as usual.
    """

    device: str = "cuda"
    d_model: int = 1024
    heads: int = 16
    dtype: str = "bfloat16"
    calibrate_warmup: int = 2
    calibrate_iters: int = 5
    loss_on: str = "device"
    costs: tuple[ReplayCosts, ...] = ()

    def __post_init__(self) -> None:
        device = self.device
        if not isinstance(device, str) or not (device == "cpu" or _is_cuda(device)):
            raise ValueError(
                f"emulate device={device!r}; valid: 'cpu', 'cuda', 'cuda:<i>' (e.g. 'cuda:0')"
            )
        for name in ("d_model", "heads", "calibrate_iters"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"emulate {name}={value!r} must be an integer >= 1")
        if not _is_int(self.calibrate_warmup) or self.calibrate_warmup < 0:
            raise ValueError(
                f"emulate calibrate_warmup={self.calibrate_warmup!r} must be an integer >= 0"
            )
        if self.dtype not in ("bfloat16", "float32"):
            raise ValueError(f"emulate dtype={self.dtype!r}; valid: bfloat16, float32")
        if self.loss_on not in ("device", "host"):
            raise ValueError(f"emulate loss_on={self.loss_on!r}; valid: device, host")
        if self.d_model % self.heads:
            raise ValueError(
                f"emulate d_model={self.d_model} must be divisible by heads={self.heads}"
            )
        object.__setattr__(self, "costs", replay_costs(self.costs))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EmulateOptions:
        """From run.json's plain dict; unknown keys raise with the valid ones listed."""
        _unknown_keys("emulate", data, cls)
        return cls(**data)


def _is_cuda(device: str) -> bool:
    kind, _, index = device.partition(":")
    return kind == "cuda" and (not index or index.isdigit())


@dataclass(frozen=True, kw_only=True)
class RuntimeOptions:
    """How the runtime runs a ``RunConfig``'s ranks; frozen, checked on construction.

    Args:
        edges_factory: ``"package.module:function"`` each rank calls as
            ``f(run_dir=RunDir, rank=int)`` for its live bubble-edge receiver; None: no live
            edges (a ``Session`` with ``side_tasks=True`` fills in its side-task worker's).
        stop_grace_s: seconds a rank gives the current step to end after a stop request before
            it records a failure and exits.
        pg_timeout_s: the process group's collective timeout in seconds.
        timed: True times every action (``TimedPipelineStage``); False runs plain
            ``PipelineStage``; "alternate" runs blocks of ``alternate_every`` steps,
            alternately timed and plain, timed first (the timing-overhead benchmark).
        alternate_every: steps per block when ``timed="alternate"``.
        announce_min_ms: the shortest predicted bubble announced live to side tasks, in ms;
            0 announces every one (``pipeline.timed_stage`` [Note: quiet slots]).
        step_group_ms: side-task steps much shorter than this are launched in groups that
            last about this long together, with one device wait and one step record per group
            (``sidetasks.host.iterative`` [Note: step groups]); 0 waits after every step.
        predictor: how a rank predicts each bubble's length for its live edges: "min", the
            minimum of the slot's last five (FreeRide's); "feedback", a percentile of its last
            16 moved by its own misses (``core.bubble_prediction``); "peers", the end the
            rank it waits for published for the action it waits on, plus the slot's usual
            hand-over, else the minimum of five (``core.peer_prediction``; ranks that time on
            the host clock: CPU ranks and the emulated pipeline's).
        outlived: what a side task's host does once a bubble outlives the rank's predicted
            end: "stop", launch no further step (FreeRide's); "survivors", take the bubble to
            last as long as its slot's recent bubbles that were longer than it has lasted so
            far say (their shortest, one in five set aside), and go on stepping while a step
            fits that (``core.bubble_survival``); "hand-on", as "survivors", except that a task
            whose leftovers a leftovers task takes hands the bubble on at the predicted end
            (``sidetasks.host.iterative`` [Note: outlived bubbles]).
        emulate: single-GPU emulate mode (``EmulateOptions``, or its fields as a dict); None
            is off.
    """

    edges_factory: str | None = None
    stop_grace_s: float = 10.0
    pg_timeout_s: float = 600.0
    timed: TimedMode = True
    alternate_every: int = 1
    announce_min_ms: float = 1.0
    step_group_ms: float = 1.0
    predictor: str = "min"
    outlived: str = "stop"
    emulate: EmulateOptions | None = None

    def __post_init__(self) -> None:
        for name in ("stop_grace_s", "pg_timeout_s"):
            value = getattr(self, name)
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or not 0 < value <= MAX_SECONDS or not math.isfinite(value):
                raise ValueError(
                    f"runtime {name}={value!r} must be seconds in (0, {MAX_SECONDS:g}]; "
                    f"e.g. {name}={getattr(RuntimeOptions, name):g}"
                )
            object.__setattr__(self, name, float(value))
        if not (self.timed is True or self.timed is False or self.timed == "alternate"):
            raise ValueError(
                f"runtime timed={self.timed!r} must be True, False or 'alternate' "
                "(alternating blocks of timed and plain steps)"
            )
        every = self.alternate_every
        if not _is_int(every) or not 1 <= every <= MAX_ALTERNATE_EVERY:
            raise ValueError(
                f"runtime alternate_every={every!r} must be an integer 1..{MAX_ALTERNATE_EVERY}"
                " (steps per block of timed='alternate')"
            )
        self._milliseconds(
            "announce_min_ms",
            MAX_ANNOUNCE_MIN_MS,
            "the shortest predicted bubble announced to side tasks (0 announces every one)",
            high_open=True,
        )
        self._milliseconds(
            "step_group_ms",
            MAX_STEP_GROUP_MS,
            "how long a group of short side-task steps may last (0 waits for the device after "
            "every step)",
        )
        if self.predictor not in PREDICTORS:
            raise ValueError(
                f"runtime predictor={self.predictor!r}; valid: {', '.join(PREDICTORS)} (the "
                "minimum of the last five bubbles, or a percentile moved by its misses)"
            )
        if self.outlived not in OUTLIVED:
            raise ValueError(
                f"runtime outlived={self.outlived!r}; valid: {', '.join(OUTLIVED)} (no step "
                "past the predicted end; steps while the slot's longer bubbles say one fits; "
                "those steps the leftovers task's where one takes them)"
            )
        spec = self.edges_factory
        if spec is not None and not (isinstance(spec, str) and _REF.fullmatch(spec)):
            raise ValueError(
                f"runtime edges_factory={spec!r} must be 'package.module:function' or None, "
                "e.g. 'freeride_lab.sidetasks.client:open_edges'"
            )
        emulate = self.emulate
        if isinstance(emulate, dict):
            emulate = EmulateOptions.from_dict(emulate) if emulate else None
            object.__setattr__(self, "emulate", emulate)
        if emulate is not None and not isinstance(emulate, EmulateOptions):
            raise ValueError(
                f"runtime emulate={emulate!r} must be EmulateOptions, a dict of its fields "
                "(device, d_model, heads, dtype, calibrate_warmup, calibrate_iters) or None"
            )

    def check_run(self, *, workload: str, backend: str | None, d_model: int, ranks: int) -> None:
        """Refuse options this run cannot use (``RunConfig`` calls it with its own fields)."""
        emulate = self.emulate
        if emulate is None:
            return
        if emulate.costs and len(emulate.costs) != ranks:
            raise ValueError(
                f"emulate costs for {len(emulate.costs)} ranks; this run has {ranks}: replay "
                "the calibration of a run with as many stages"
            )
        if workload != "text" or backend != "gloo":
            raise ValueError(
                f"emulate mode needs workload='text' and backend='gloo' (pipeline tensors stay "
                f"on the CPU); got workload={workload!r}, backend={backend!r}"
            )
        if emulate.d_model % d_model:
            raise ValueError(
                f"emulate d_model={emulate.d_model} must be a multiple of the wire width "
                f"d_model={d_model} (see pipeline.emulate [Note: wire width]); raise emulate "
                "d_model or lower d_model"
            )

    def _milliseconds(
        self, name: str, high: float, meaning: str, *, high_open: bool = False
    ) -> None:
        """Check that field ``name`` is milliseconds in [0, high] (or [0, high)); store a float."""
        value = getattr(self, name)
        if not (_is_ms(value) and (value < high if high_open else value <= high)):
            raise ValueError(
                f"runtime {name}={value!r} must be milliseconds in [0, {high:g}"
                f"{')' if high_open else ']'}: {meaning}"
            )
        object.__setattr__(self, name, float(value))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RuntimeOptions:
        """From run.json's plain dict; unknown keys raise with the valid ones listed."""
        if not isinstance(data, dict):
            raise ValueError(f"runtime={data!r} must be RuntimeOptions or a dict of its fields")
        _unknown_keys("runtime", data, cls)
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """Plain fields, as run.json stores them (``emulate`` as a dict or None)."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> RuntimeOptions:
        return dataclasses.replace(self, **changes)


RUNTIME_KEYS = tuple(f.name for f in dataclasses.fields(RuntimeOptions))
