"""``RunConfig``: everything that defines a pipeline training run, validated on construction.

Only checks that need no environment live here (sizes, names, schedule feasibility); the
launcher adds the ones that do (port in use, run directory writable, CUDA present).

    >>> RunConfig(schedule="1f1b", stages=4, microbatches=8).schedule
    '1F1B'
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import InitVar, dataclass, field
from typing import Any, Literal

from freeride_lab.core.runtime_options import RUNTIME_KEYS, EmulateOptions, RuntimeOptions
from freeride_lab.core.schedule import Schedule, torch_plan

__all__ = [
    "COST_FIELDS",
    "MAX_COST_MS",
    "MAX_MICROBATCHES",
    "MAX_STAGE_CHUNKS",
    "CostMs",
    "EmulateOptions",
    "RunConfig",
    "RuntimeOptions",
    "cost_text",
]

# Bounds checked before torch's plan is built (building it is quadratic-ish in these sizes:
# 100000 stages take minutes and gigabytes).
MAX_STAGE_CHUNKS = 4096
MAX_MICROBATCHES = 65536
# Bounds a run can meet: beyond them a value is a typo, or fails only after the launch.
_UPPER = {
    "steps": 10**9,
    "layers": 4096,
    "d_model": 65536,
    "heads": 4096,
    "seq_len": 1 << 20,
    "microbatch_size": 1 << 16,
    "nnodes": 4096,
}
MAX_COST_MS = 3_600_000.0  # one synthetic action: an hour
MAX_SEED = 2**64 - 1  # torch.manual_seed takes 64 bits
MAX_ACTIVATION_BYTES = 1 << 40  # one micro-batch's activations per block, float32: 1 TiB

# The synthetic workload's action costs, F, I and W in that order.
COST_FIELDS = ("t_forward_ms", "t_backward_input_ms", "t_backward_weight_ms")
CostMs = float | tuple[float, ...]  # every stage alike, or one value per stage chunk

Workload = Literal["text", "synthetic"]
Device = Literal["cpu", "cuda"]


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A pipeline training run.

    Args:
        schedule: torch's schedule name (case-insensitive), e.g. "1F1B", "Interleaved1F1B".
        stages: pipeline ranks S (processes; one GPU each on CUDA); stages x chunks is at
            most ``MAX_STAGE_CHUNKS``.
        microbatches: micro-batches M per step, at most ``MAX_MICROBATCHES``.
        chunks: model chunks v per rank; None picks the schedule's default.
        steps: training steps to run.
        workload: "text" trains a byte-level GPT on real text; "synthetic" runs sleep-timed
            stages with the given ``t_*_ms`` costs (exact, contention-free timing on CPU).
        t_forward_ms, t_backward_input_ms, t_backward_weight_ms: the synthetic workload's per
            micro-batch costs in ms. One number is the cost of one rank, split evenly over its
            chunks (every stage alike); a sequence gives each stage chunk its own cost, one
            value per global stage (``stages * chunks`` values, stage 0 first; for chunks=1 one
            per rank). Sequences are stored as tuples (lists in JSON). See ``stage_costs_ms``.
        layers, d_model, heads, seq_len, microbatch_size: GPT size (text workload; the synthetic
            workload uses d_model, seq_len and microbatch_size for its tensors).
        text_path: a text file or directory for the text workload; None uses the Python standard
            library's own source files.
        device, backend: "cpu" with gloo or "cuda" with NCCL; backend None picks by device.
        nnodes, node_rank, master_addr, master_port: rendezvous; port None picks a free one.
        bus_host: address the event bus binds to (loopback by default).
        run_dir: where the run directory goes; None makes one under ./runs.
        side_tasks: start a side-task worker beside every rank, so side tasks can be attached
            while the run trains (``Session.attach``); False is the ``vanilla`` mode: no
            worker, no live bubble edges.
        mps: serve the run with a private CUDA MPS daemon (side tasks then get MPS memory caps,
            SM shares and priorities); None starts one when ``device="cuda"`` and MPS is
            available here, False never does. Only meaningful with ``device="cuda"``.
        runtime: how the ranks run (live edges, stop grace, collective timeout, timing,
            emulate mode): ``RuntimeOptions`` or a dict of its fields.
        notes: the user's own notes, plain JSON (no NaN, no objects); stored in run.json and
            shown in reports, never read by the runtime.
        extra: not a field: run.json files of older versions carry it, and ``from_dict``
            splits it into ``runtime`` and ``notes``; passing it here raises.
        check_plan: build torch's plan to check that the schedule can run (imports torch,
            seconds); False only for a config that was checked before (a run's run.json).
            Not a field: it is not stored.
    """

    schedule: str = "1F1B"
    stages: int = 4
    microbatches: int = 8
    chunks: int | None = None
    steps: int = 20
    workload: Workload = "text"
    t_forward_ms: CostMs = 20.0
    t_backward_input_ms: CostMs = 20.0
    t_backward_weight_ms: CostMs = 20.0
    layers: int = 8
    d_model: int = 64
    heads: int = 4
    seq_len: int = 64
    microbatch_size: int = 4
    lr: float = 3e-3
    seed: int = 0
    dtype: Literal["float32", "bfloat16"] = "float32"
    text_path: str | None = None
    device: Device = "cpu"
    backend: str | None = None
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    bus_host: str = "127.0.0.1"
    run_dir: str | None = None
    side_tasks: bool = True
    mps: bool | None = None
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)
    notes: dict[str, Any] = field(default_factory=dict)
    extra: InitVar[dict[str, Any] | None] = None
    check_plan: InitVar[bool] = True

    def __post_init__(self, extra: dict[str, Any] | None, check_plan: bool) -> None:
        if extra is not None:
            raise TypeError(
                f"RunConfig(extra={extra!r}): extra is split in two; pass runtime options as "
                f"runtime=RuntimeOptions(...) (fields: {', '.join(RUNTIME_KEYS)}) and your "
                "own notes as notes={...}"
            )
        spec = Schedule.from_name(self.schedule)
        object.__setattr__(self, "schedule", spec.name)
        for name in (
            "stages",
            "microbatches",
            "steps",
            "layers",
            "d_model",
            "heads",
            "seq_len",
            "microbatch_size",
            "nnodes",
        ):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"{name}={value!r} must be an integer >= 1")
            if name in _UPPER and value > _UPPER[name]:
                raise ValueError(f"{name}={value} is above the limit of {_UPPER[name]}")
        for name in ("seed", "node_rank"):
            value = getattr(self, name)
            if not _is_int(value):
                raise ValueError(f"{name}={value!r} must be an integer")
        for name in ("chunks", "master_port"):
            value = getattr(self, name)
            if value is not None and not _is_int(value):
                raise ValueError(f"{name}={value!r} must be an integer or None")
        for name in ("t_forward_ms", "t_backward_input_ms", "t_backward_weight_ms", "lr"):
            value = getattr(self, name)
            if name in COST_FIELDS and isinstance(value, list | tuple):
                object.__setattr__(
                    self, name, tuple(_cost(name, x, i) for i, x in enumerate(value))
                )
            elif name in COST_FIELDS:
                object.__setattr__(self, name, _cost(name, value))
            elif not _finite_at_least_0(value):
                raise ValueError(f"{name}={value!r} must be a finite number >= 0")
            else:  # a learning rate is a float, in run.json too (an int of 2**64 is not JSON's)
                object.__setattr__(self, name, float(value))
        if not -(2**63) <= self.seed <= MAX_SEED:
            raise ValueError(f"seed={self.seed} must fit in 64 bits (-2**63 .. 2**64-1)")
        for name in ("workload", "device", "dtype", "master_addr", "bus_host"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{name}={value!r} must be a non-empty string")
        for name in ("backend", "text_path", "run_dir"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name}={value!r} must be a string or None")
        if isinstance(self.runtime, dict):
            object.__setattr__(self, "runtime", RuntimeOptions.from_dict(self.runtime))
        if not isinstance(self.runtime, RuntimeOptions):
            raise ValueError(
                f"runtime={self.runtime!r} must be RuntimeOptions or a dict of its fields "
                f"({', '.join(RUNTIME_KEYS)})"
            )
        _check_notes(self.notes)
        if self.text_path is not None and not self.text_path.strip():
            raise ValueError("text_path='' must name a file, or be None for the built-in text")
        if self.workload not in ("text", "synthetic"):
            raise ValueError(f"workload={self.workload!r}; valid: text, synthetic")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r}; valid: cpu, cuda")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype={self.dtype!r}; valid: float32, bfloat16")
        if self.backend is None:
            object.__setattr__(self, "backend", "nccl" if self.device == "cuda" else "gloo")
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"backend={self.backend!r}; valid: gloo, nccl")
        if self.backend == "nccl" and self.device != "cuda":
            raise ValueError("backend='nccl' needs device='cuda'; use backend='gloo' on CPU")
        self.runtime.check_run(
            workload=self.workload, backend=self.backend, d_model=self.d_model, ranks=self.stages
        )
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank={self.node_rank} must be in [0, nnodes={self.nnodes})")
        if self.stages % self.nnodes:
            raise ValueError(
                f"stages={self.stages} must divide evenly over nnodes={self.nnodes} "
                "(one rank per stage, the same number per node)"
            )
        if not isinstance(self.side_tasks, bool):
            raise ValueError(f"side_tasks={self.side_tasks!r} must be True or False")
        if self.mps is not None and not isinstance(self.mps, bool):
            raise ValueError(f"mps={self.mps!r} must be True, False or None (auto)")
        if self.mps is True and self.device != "cuda":
            raise ValueError("mps=True needs device='cuda'; MPS shares GPUs, use mps=None on CPU")
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise ValueError(f"master_port={self.master_port} must be in 1..65535 (or None)")
        v = spec.resolve_chunks(self.chunks)
        object.__setattr__(self, "chunks", v)
        if self.workload == "text":
            if self.layers < self.stages * v:
                raise ValueError(
                    f"layers={self.layers} < stagesxchunks={self.stages * v}: every stage chunk "
                    f"needs at least one block; raise layers or lower stages/chunks"
                )
            if self.d_model % self.heads:
                raise ValueError(f"d_model={self.d_model} must be divisible by heads={self.heads}")
        if self.stages * v > MAX_STAGE_CHUNKS:
            raise ValueError(
                f"stagesxchunks={self.stages * v} is above the limit of {MAX_STAGE_CHUNKS} "
                "stage chunks; lower stages or chunks"
            )
        for name in COST_FIELDS:
            value = getattr(self, name)
            if isinstance(value, tuple) and len(value) != self.stages * v:
                raise ValueError(
                    f"{name}={list(value)} has {len(value)} value(s) but the run has "
                    f"stages x chunks = {self.stages * v} stage chunks; give one "
                    "value per stage chunk (stage 0 first), or one number for every stage"
                )
        if self.microbatches > MAX_MICROBATCHES:
            raise ValueError(
                f"microbatches={self.microbatches} is above the limit of {MAX_MICROBATCHES}"
            )
        activation = self.microbatch_size * self.seq_len * self.d_model * 4
        if self.workload == "text" and activation > MAX_ACTIVATION_BYTES:
            raise ValueError(
                f"microbatch_size x seq_len x d_model x 4 bytes = {activation} bytes per block "
                f"is above {MAX_ACTIVATION_BYTES} (1 TiB); lower the sizes"
            )
        if check_plan:
            # a new run (run.json of an old one may name a file that has moved since)
            text = self.text_path if self.workload == "text" else None
            if text is not None and not os.path.isfile(text):
                raise ValueError(
                    f"text_path={self.text_path!r} is not a file; pass an existing text "
                    "file, or None for the built-in text"
                )
            torch_plan(spec, self.stages, self.microbatches, v)  # ValueError with torch's reason

    @property
    def stage_count(self) -> int:
        """Total stage chunks S·v."""
        assert self.chunks is not None
        return self.stages * self.chunks

    def stage_costs_ms(self) -> tuple[tuple[float, float, float], ...]:
        """(F, I, W) ms per micro-batch of every stage chunk, indexed by global stage.

        A scalar field is one rank's cost split evenly over its chunks; a sequence field is
        already one value per stage chunk.

            >>> RunConfig(schedule="Interleaved1F1B", stages=2, microbatches=4,
            ...           t_forward_ms=(1, 2, 3, 4), t_backward_input_ms=8.0,
            ...           t_backward_weight_ms=2.0, check_plan=False).stage_costs_ms()[1]
            (2.0, 4.0, 1.0)
        """
        n = self.stage_count
        columns = []
        for name in COST_FIELDS:
            value = getattr(self, name)
            columns.append(value if isinstance(value, tuple) else (value / (n // self.stages),) * n)
        return tuple(zip(*columns, strict=True))

    def to_dict(self) -> dict[str, Any]:
        """Plain fields (per-stage costs as lists, as JSON stores them)."""
        data = dataclasses.asdict(self)
        for name in COST_FIELDS:
            if isinstance(data[name], tuple):
                data[name] = list(data[name])
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, check_plan: bool = True) -> RunConfig:
        """Rebuild from ``to_dict`` output; unknown keys raise with the valid ones listed.

        A run.json of an older version keeps ``extra`` (runtime keys and the user's notes in
        one dict); it is split into ``runtime`` and ``notes`` here, so old run directories
        still open.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names - {"extra"})
        if unknown:
            raise ValueError(
                f"unknown RunConfig field(s) {unknown}; valid: {', '.join(sorted(names))}"
            )
        if "extra" in data:
            data = _split_legacy_extra(data)
        return cls(**data, check_plan=check_plan)

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)


def _split_legacy_extra(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with an older version's ``extra`` split into ``runtime`` and ``notes``."""
    data = dict(data)
    extra = data.pop("extra")
    if extra is None:
        return data
    if not isinstance(extra, dict):
        raise ValueError(f"extra={extra!r} must be a dict (a run.json of an older version)")
    if "runtime" in data or "notes" in data:
        raise ValueError(
            "a config has both extra (older versions) and runtime/notes; keep runtime and notes"
        )
    data["runtime"] = {k: v for k, v in extra.items() if k in RUNTIME_KEYS}
    data["notes"] = {k: v for k, v in extra.items() if k not in RUNTIME_KEYS}
    return data


def _check_notes(notes: Any) -> None:
    """The user's notes: a dict of plain JSON (stored in run.json and shown in reports)."""
    if not isinstance(notes, dict):
        raise ValueError(f"notes={notes!r} must be a dict of plain JSON values")
    for key, value in notes.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"notes key {key!r} must be a non-empty string")
        if key in RUNTIME_KEYS:
            raise ValueError(
                f"notes[{key!r}] is a runtime option, which the runtime never reads from notes; "
                f"pass runtime=RuntimeOptions({key}=...) instead"
            )
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"notes[{key!r}] must be plain JSON (no NaN, no objects): {exc}"
            ) from None


def cost_text(value: CostMs) -> str:
    """A ``t_*_ms`` field for people: ``"20"`` or, per stage chunk, ``"10,10,20,10"``.

    >>> cost_text(20.0), cost_text((10.0, 12.5))
    ('20', '10,12.5')
    """
    values = value if isinstance(value, tuple) else (value,)
    return ",".join(f"{x:g}" for x in values)


def _finite_at_least_0(value: Any) -> bool:
    """A real number (not a bool), finite and >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value) and value >= 0
    except OverflowError:  # an int too large for a float, e.g. 10**400
        return False


def _cost(name: str, value: Any, index: int | None = None) -> float:
    """One synthetic action cost in ms as a float; ``index`` names its stage chunk."""
    where = name if index is None else f"{name}[{index}]"
    if not _finite_at_least_0(value):
        raise ValueError(
            f"{where}={value!r} must be a finite number of ms >= 0; give one number for every "
            "stage or a list with one per stage chunk, e.g. [10, 10, 20, 10]"
        )
    if value > MAX_COST_MS:
        raise ValueError(
            f"{where}={value!r} is above the limit of {MAX_COST_MS:g} (an hour); give a cost "
            "in ms below it"
        )
    return float(value)


def _is_int(value: Any) -> bool:
    """An ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)
