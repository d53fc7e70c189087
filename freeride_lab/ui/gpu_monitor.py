"""GPU monitor widget: utilisation, memory (training vs side tasks), power, per GPU.

    mon = GpuMonitor(roles={4242: ProcessRole("training", "rank 0")})
    mon.start()          # samples NVML every 0.5 s on a daemon thread
    mon                  # displays; "no GPU — CPU run" where NVML is missing

Rendering is a pure function of samples and roles (:func:`render_html`), so it is tested with
fake samples; the widget is one ``ipywidgets.HTML`` whose ``value`` is replaced per tick.
NVML reports process ids as the host sees them: inside a container with its own PID namespace
the pids of ``roles`` may not match, and that memory shows as "other".
"""

from __future__ import annotations

import html
import math
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from freeride_lab.gpu.nvml import GpuSample, NvmlSampler

if TYPE_CHECKING:
    import ipywidgets

__all__ = ["GpuMonitor", "MemorySplit", "ProcessRole", "memory_split", "render_html"]

_GIB = 1024**3
_COLORS = {"training": "#4c78a8", "side_task": "#54a24b", "other": "#bab0ac"}


class ProcessRole(NamedTuple):
    """What a GPU process is: a training rank or a side task, with a display label."""

    kind: Literal["training", "side_task"]
    label: str  # e.g. "rank 1", "resnet18 (t1)"


class MemorySplit(NamedTuple):
    """A GPU's memory by owner, in bytes (NaN where NVML could not read it)."""

    training_bytes: float
    side_task_bytes: float
    other_bytes: float  # used by processes not in the roles, or not attributable to any process
    free_bytes: float


def memory_split(sample: GpuSample, roles: Mapping[int, ProcessRole]) -> MemorySplit:
    """Split ``sample``'s used memory into training, side tasks and other."""
    training = sum(
        b for pid, b in sample.processes if pid in roles and roles[pid].kind == "training"
    )
    side = sum(b for pid, b in sample.processes if pid in roles and roles[pid].kind == "side_task")
    used, total = sample.memory_used_bytes, sample.memory_total_bytes
    other = max(used - training - side, 0.0) if not math.isnan(used) else math.nan
    free = total - used if not (math.isnan(total) or math.isnan(used)) else math.nan
    return MemorySplit(float(training), float(side), other, free)


def _gib(value: float) -> str:
    return "-" if math.isnan(value) else f"{value / _GIB:.1f} GiB"


def _num(value: float, fmt: str) -> str:
    return "-" if math.isnan(value) else format(value, fmt)


def _bar(parts: Sequence[tuple[str, float, str]], total: float) -> str:
    if math.isnan(total) or total <= 0:
        return '<div class="fr-gpu-bar fr-gpu-unknown">unknown</div>'
    spans = "".join(
        f'<span title="{html.escape(title)}" style="width:{100 * value / total:.2f}%;'
        f'background:{color}"></span>'
        for title, value, color in parts
        if not math.isnan(value) and value > 0
    )
    return f'<div class="fr-gpu-bar">{spans}</div>'


_STYLE = (
    "<style>.fr-gpu{font:13px system-ui,sans-serif}.fr-gpu table{border-collapse:collapse}"
    ".fr-gpu td,.fr-gpu th{padding:2px 8px;text-align:left}"
    ".fr-gpu-bar{display:flex;width:220px;height:12px;background:#eee;border-radius:2px;overflow:hidden}"
    ".fr-gpu-bar span{display:block;height:100%}.fr-gpu-none{color:#666;font-style:italic}</style>"
)


def _gpu_row(sample: GpuSample, roles: Mapping[int, ProcessRole]) -> str:
    split = memory_split(sample, roles)
    name = f"GPU {sample.index}"
    if sample.cuda_ordinal is not None:
        name += f" (cuda:{sample.cuda_ordinal})"
    util = sample.utilization_pct
    util_bar = _bar([("utilisation", util, "#f58518")], 100.0)
    mem_bar = _bar(
        [
            (f"training {_gib(split.training_bytes)}", split.training_bytes, _COLORS["training"]),
            (
                f"side tasks {_gib(split.side_task_bytes)}",
                split.side_task_bytes,
                _COLORS["side_task"],
            ),
            (f"other {_gib(split.other_bytes)}", split.other_bytes, _COLORS["other"]),
        ],
        sample.memory_total_bytes,
    )
    return (
        f"<tr><th>{html.escape(name)}</th><td>{util_bar}{_num(util, '.0f')} %</td>"
        f"<td>{mem_bar}{_gib(sample.memory_used_bytes)} / {_gib(sample.memory_total_bytes)} · "
        f"training {_gib(split.training_bytes)} · side {_gib(split.side_task_bytes)}</td>"
        f"<td>{_num(sample.power_w, '.0f')} W</td>"
        f"<td>{_num(sample.sm_clock_mhz, '.0f')} MHz</td></tr>"
    )


def _process_rows(samples: Sequence[GpuSample], roles: Mapping[int, ProcessRole]) -> str:
    rows = []
    for sample in samples:
        for pid, used in sorted(sample.processes, key=lambda p: -p[1]):
            role = roles.get(pid)
            kind = "other" if role is None else role.kind
            label = "not part of this run" if role is None else role.label
            rows.append(
                f"<tr><td>GPU {sample.index}</td><td>{pid}</td>"
                f'<td style="color:{_COLORS[kind]}">{html.escape(kind.replace("_", " "))}</td>'
                f"<td>{html.escape(label)}</td><td>{_gib(float(used))}</td></tr>"
            )
    if not rows:
        return ""
    head = "<tr><th>GPU</th><th>pid</th><th>role</th><th>what</th><th>memory</th></tr>"
    return f"<table class='fr-gpu-procs'>{head}{''.join(rows)}</table>"


def render_html(
    samples: Sequence[GpuSample],
    roles: Mapping[int, ProcessRole] | None = None,
    *,
    reason: str | None = None,
) -> str:
    """The monitor's HTML for one tick; no samples give a "no GPU — CPU run" notice."""
    roles = roles or {}
    if not samples:
        why = f" ({html.escape(reason)})" if reason else ""
        return f'{_STYLE}<div class="fr-gpu fr-gpu-none">no GPU — CPU run{why}</div>'
    head = "<tr><th>GPU</th><th>utilisation</th><th>memory</th><th>power</th><th>SM clock</th></tr>"
    body = "".join(_gpu_row(s, roles) for s in sorted(samples, key=lambda s: s.index))
    return (
        f'{_STYLE}<div class="fr-gpu"><table>{head}{body}</table>'
        f"{_process_rows(samples, roles)}</div>"
    )


class GpuMonitor:
    """Per-GPU utilisation, memory split and power, redrawn from an :class:`NvmlSampler`.

    ``roles`` maps process ids to :class:`ProcessRole` (update it with :meth:`set_roles` as
    ranks and side tasks start). The sampler's thread redraws the widget after every read.
    """

    def __init__(
        self,
        sampler: NvmlSampler | None = None,
        *,
        roles: Mapping[int, ProcessRole] | None = None,
        interval_s: float = 0.5,
    ) -> None:
        self.sampler = sampler if sampler is not None else NvmlSampler(interval_s)
        self.roles: dict[int, ProcessRole] = dict(roles or {})
        self.redraws = 0
        self._owns_sampler = sampler is None
        self._samples: list[GpuSample] = []
        self._lock = threading.Lock()
        self._widget: ipywidgets.HTML | None = None
        self._html = render_html([], reason=self.sampler.reason)

    def __repr__(self) -> str:
        state = "sampling" if self.sampler.running else "idle"
        return f"<GpuMonitor {state} gpus={len(self._samples)} redraws={self.redraws}>"

    @property
    def html(self) -> str:
        """The current rendering."""
        return self._html

    @property
    def widget(self) -> ipywidgets.HTML:
        if self._widget is None:
            import ipywidgets

            self._widget = ipywidgets.HTML(value=self._html)
        return self._widget

    def start(self) -> GpuMonitor:
        """Start redrawing on every sampler tick (a no-op without NVML: the notice stays)."""
        self.sampler.on_tick = self.update
        self.sampler.start()
        return self

    def stop(self) -> None:
        """Stop redrawing (and the sampler, if this monitor created it). Idempotent."""
        if self.sampler.on_tick == self.update:
            self.sampler.on_tick = None
        if self._owns_sampler:
            self.sampler.stop()

    def set_roles(self, roles: Mapping[int, ProcessRole]) -> None:
        """Replace the pid → role mapping and redraw."""
        with self._lock:
            self.roles = dict(roles)
            samples = self._samples
        self.update(samples)

    def update(self, samples: Sequence[GpuSample]) -> None:
        """Redraw from one tick's samples (callable from the sampler thread)."""
        with self._lock:
            self._samples = list(samples)
            page = render_html(self._samples, self.roles, reason=self.sampler.reason)
            if page == self._html:
                return
            self._html = page
            self.redraws += 1
        if self._widget is not None:
            self._widget.value = page

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)
