"""GPU monitor widget: a short history of SM %, memory (training vs side tasks), power and SM
clock per GPU, as sparklines.

    mon = GpuMonitor(roles={4242: ProcessRole("training", "rank 0")})
    mon.start()          # samples NVML every 0.5 s on a daemon thread
    mon                  # displays; "no GPU — CPU run" where NVML is missing

Rendering is a pure function of samples and roles (:func:`render_html`), so it is tested with
fake samples; the widget is one ``ipywidgets.HTML`` whose ``value`` is replaced per tick. The
monitor keeps the last ``history_len`` readings of each GPU (a minute at the default 0.5 s).
NVML reports process ids as the host sees them: inside a container with its own PID namespace
the pids of ``roles`` may not match, and that memory shows as "other".
"""

from __future__ import annotations

import collections
import html
import math
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from freeride_lab.gpu.nvml import GpuSample, NvmlSampler
from freeride_lab.ui.sparkline import sparkline_svg

if TYPE_CHECKING:
    import ipywidgets

__all__ = ["GpuMonitor", "MemorySplit", "ProcessRole", "memory_split", "render_html"]

_GIB = 1024**3
_COLORS = {"training": "#0072B2", "side_task": "#009E73", "other": "#999999"}  # Okabe-Ito


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
    "<style>.fr-gpu{font:var(--jp-ui-font-size1,13px) "
    "var(--jp-ui-font-family,system-ui,sans-serif);"
    "color:var(--jp-ui-font-color1,#222);max-width:100%;min-width:0}"
    ".fr-gpu-card{border:1px solid var(--jp-border-color2,#ddd);border-radius:6px;padding:4px 8px;"
    "margin-bottom:6px}.fr-gpu-name{font-weight:600}"
    ".fr-gpu-metrics{display:grid;gap:4px 12px;"
    "grid-template-columns:repeat(auto-fit,minmax(170px,1fr))}"
    ".fr-gpu-metric{min-width:0}.fr-gpu-metric .fr-spark{display:block;max-width:100%}"
    ".fr-gpu-label{color:var(--jp-ui-font-color2,#666);font-size:12px}"
    ".fr-gpu-value{font-variant-numeric:tabular-nums;overflow-wrap:anywhere}"
    ".fr-gpu table{border-collapse:collapse;max-width:100%}"
    ".fr-gpu td,.fr-gpu th{padding:2px 8px;text-align:left}"
    ".fr-gpu-procs-wrap{overflow-x:auto;max-width:100%}"
    ".fr-gpu-bar{display:flex;max-width:220px;height:10px;background:var(--jp-layout-color3,#eee);"
    "border-radius:2px;overflow:hidden}.fr-gpu-bar span{display:block;height:100%}"
    ".fr-gpu-none{color:var(--jp-ui-font-color2,#666);font-style:italic}</style>"
)

# (title, unit, reading, its fixed range or None for 0..max seen, Okabe-Ito colour)
_METRICS = (
    ("SM utilisation", "%", "utilization_pct", (0.0, 100.0), "#E69F00"),
    ("memory used", "GiB", "memory_used_bytes", None, "#0072B2"),
    ("power", "W", "power_w", None, "#D55E00"),
    ("SM clock", "MHz", "sm_clock_mhz", None, "#009E73"),
)


def _metric(
    history: Sequence[GpuSample],
    title: str,
    unit: str,
    field: str,
    fixed: tuple[float, float] | None,
    color: str,
    detail: str,
) -> str:
    scale = _GIB if unit == "GiB" else 1.0
    values = [getattr(s, field) / scale for s in history]
    latest = values[-1]
    finite = [v for v in values if math.isfinite(v)]
    if fixed is not None:
        low, high = fixed
    else:
        total = history[-1].memory_total_bytes / _GIB if unit == "GiB" else math.nan
        low, high = 0.0, total if math.isfinite(total) else max(finite, default=1.0)
    fmt = ".1f" if unit == "GiB" else ".0f"
    seen = (
        f"{min(finite):{fmt}} to {max(finite):{fmt}} {unit} over the last {len(values)} readings"
        if finite
        else "not readable"
    )
    spark = sparkline_svg(values, low=low, high=high, label=f"{title}: {seen}", color=color)
    return (
        f'<div class="fr-gpu-metric" title="{html.escape(seen)}">'
        f'<div class="fr-gpu-label">{title}</div>{spark}'
        f'<div class="fr-gpu-value">{_num(latest, fmt)} {unit}{detail}</div></div>'
    )


def _gpu_card(history: Sequence[GpuSample], roles: Mapping[int, ProcessRole]) -> str:
    """One GPU: a sparkline per metric (oldest reading first), the newest value under each."""
    sample = history[-1]
    split = memory_split(sample, roles)
    name = f"GPU {sample.index}"
    if sample.cuda_ordinal is not None:
        name += f" (cuda:{sample.cuda_ordinal})"
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
    details = {
        "memory_used_bytes": (
            f" / {_gib(sample.memory_total_bytes)}{mem_bar}training "
            f"{_gib(split.training_bytes)} · side {_gib(split.side_task_bytes)}"
        ),
    }
    cells = "".join(
        _metric(history, title, unit, field, fixed, color, details.get(field, ""))
        for title, unit, field, fixed, color in _METRICS
    )
    return (
        f'<div class="fr-gpu-card"><div class="fr-gpu-name">{html.escape(name)}</div>'
        f'<div class="fr-gpu-metrics">{cells}</div></div>'
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
    return (
        f"<div class='fr-gpu-procs-wrap'><table class='fr-gpu-procs'>{head}{''.join(rows)}"
        "</table></div>"
    )


def render_html(
    samples: Sequence[GpuSample],
    roles: Mapping[int, ProcessRole] | None = None,
    *,
    reason: str | None = None,
    history: Mapping[int, Sequence[GpuSample]] | None = None,
) -> str:
    """The monitor's HTML for one tick; no samples give a "no GPU — CPU run" notice.

    Args:
        history: each GPU's recent readings by NVML index, oldest first, drawn as sparklines;
            None (or a GPU missing from it) draws the newest sample alone.
    """
    roles = roles or {}
    if not samples:
        why = f" ({html.escape(reason)})" if reason else ""
        return f'{_STYLE}<div class="fr-gpu fr-gpu-none">no GPU — CPU run{why}</div>'
    history = history or {}
    cards = "".join(
        _gpu_card(list(history.get(s.index) or [s]), roles)
        for s in sorted(samples, key=lambda s: s.index)
    )
    return f'{_STYLE}<div class="fr-gpu">{cards}{_process_rows(samples, roles)}</div>'


class GpuMonitor:
    """Per-GPU sparklines of SM utilisation, memory, power and SM clock over the last
    ``history_len`` readings, redrawn from an :class:`NvmlSampler`.

    ``roles`` maps process ids to :class:`ProcessRole` (update it with :meth:`set_roles` as
    ranks and side tasks start). The sampler's thread redraws the widget after every read; a
    reading no newer than the last one of its GPU adds nothing to the history.
    """

    def __init__(
        self,
        sampler: NvmlSampler | None = None,
        *,
        roles: Mapping[int, ProcessRole] | None = None,
        interval_s: float = 0.5,
        history_len: int = 120,
    ) -> None:
        if history_len < 2:
            raise ValueError(f"history_len={history_len!r} must be >= 2 (readings per sparkline)")
        self.history_len = history_len
        self.history: dict[int, collections.deque[GpuSample]] = {}
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
            for sample in self._samples:
                kept = self.history.setdefault(
                    sample.index, collections.deque(maxlen=self.history_len)
                )
                if not kept or sample.t_ns > kept[-1].t_ns:
                    kept.append(sample)
            page = render_html(
                self._samples, self.roles, reason=self.sampler.reason, history=self.history
            )
            if page == self._html:
                return
            self._html = page
            self.redraws += 1
        if self._widget is not None:
            self._widget.value = page

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)
