"""NVML readings for dashboards: the only module of freeride_lab that imports ``pynvml``.

Every NVML call goes through :func:`query`, which initialises NVML on first use, turns any
failure into ``default`` (NaN unless told) and logs once per function. Without NVML (a CPU run,
CI, Binder) nothing raises: :func:`is_available` is False, :func:`device_count` is 0 and
:func:`unavailable_reason` says why.

    >>> from freeride_lab.gpu import nvml
    >>> nvml.is_available()                          # doctest: +SKIP
    False
    >>> nvml.unavailable_reason()                    # doctest: +SKIP
    'NVML library not found (no NVIDIA driver on this machine): CPU run'
    >>> sampler = nvml.NvmlSampler(interval_s=0.5).start()   # doctest: +SKIP
    >>> sampler.latest()                                      # doctest: +SKIP
    {0: GpuSample(index=0, t_ns=..., utilization_pct=87.0, ...)}

NVML numbers devices in PCI bus order; CUDA numbers the devices it can see, filtered and
reordered by ``CUDA_VISIBLE_DEVICES``. :func:`cuda_to_nvml` maps one to the other.

# [Note: NVML process-wide state]
# NVML initialisation is the one piece of process-wide mutable state in freeride_lab (STYLE.md
# house rule 14): ``_State`` below, guarded by a lock, initialised on the first query and shut
# down once at exit. Nothing happens at import time.
"""

from __future__ import annotations

import atexit
import collections
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from freeride_lab.io.background import BackgroundThread

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

__all__ = [
    "GpuSample",
    "NvmlSampler",
    "cuda_to_nvml",
    "device_count",
    "device_name",
    "device_uuids",
    "driver_version",
    "is_available",
    "map_cuda_visible_devices",
    "query",
    "read_samples",
    "samples_frame",
    "unavailable_reason",
]

NAN = math.nan
_NO_NVML_HINT = "no NVIDIA GPU monitoring; the run continues without GPU metrics"


class _State:
    """NVML initialisation state (see [Note: NVML process-wide state])."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tried = False
        self.module: Any = None  # the pynvml module once initialised
        self.reason: str | None = None  # why NVML is unavailable, None while unknown or fine
        self.logged: set[str] = set()  # function names already warned about


_STATE = _State()


def _init() -> Any:
    """Initialise NVML once; return the pynvml module, or None with ``_STATE.reason`` set."""
    if _STATE.tried:
        return _STATE.module
    with _STATE.lock:
        if _STATE.tried:
            return _STATE.module
        _STATE.tried = True
        try:
            import pynvml
        except ImportError as exc:
            _STATE.reason = (
                f"nvidia-ml-py is not installed ({exc}); install it with "
                "`pip install nvidia-ml-py` to see GPU metrics"
            )
            log.info("NVML unavailable: %s", _STATE.reason)
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            _STATE.reason = "NVML library not found (no NVIDIA driver on this machine): CPU run"
        except pynvml.NVMLError as exc:
            _STATE.reason = f"NVML failed to initialise ({exc}); {_NO_NVML_HINT}"
        except OSError as exc:  # a broken libnvidia-ml.so
            _STATE.reason = f"NVML could not be loaded ({exc}); {_NO_NVML_HINT}"
        if _STATE.reason is not None:
            log.info("NVML unavailable: %s", _STATE.reason)
            return None
        _STATE.module = pynvml
        atexit.register(_shutdown)
        return pynvml


def _shutdown() -> None:
    with _STATE.lock:
        module, _STATE.module = _STATE.module, None
        if module is not None:
            try:
                module.nvmlShutdown()
            except Exception:  # exiting anyway
                log.debug("nvmlShutdown failed", exc_info=True)


def _warn_once(func_name: str, message: str, *args: object) -> None:
    if func_name in _STATE.logged:
        return
    _STATE.logged.add(func_name)
    log.warning(message, *args)


def query(func_name: str, *args: Any, default: Any = NAN) -> Any:
    """Call ``pynvml.<func_name>(*args)``; return ``default`` if NVML or the call fails.

    Failures are logged once per function name (``nvmlDeviceGetPowerUsage`` is unsupported on
    some boards, for example) and never raised.
    """
    module = _init()
    if module is None:
        return default
    func = getattr(module, func_name, None)
    if func is None:
        _warn_once(func_name, "NVML has no function %s in this nvidia-ml-py version", func_name)
        return default
    try:
        return func(*args)
    except module.NVMLError as exc:
        _warn_once(func_name, "NVML %s failed: %s (further failures not logged)", func_name, exc)
        return default


def is_available() -> bool:
    """True when NVML initialised (an NVIDIA driver is present)."""
    return _init() is not None


def unavailable_reason() -> str | None:
    """Why NVML cannot be used, written for the user; None when it works."""
    _init()
    return _STATE.reason


def device_count() -> int:
    """Number of GPUs NVML sees (all of them, regardless of ``CUDA_VISIBLE_DEVICES``)."""
    count = query("nvmlDeviceGetCount", default=0)
    return int(count)


def driver_version() -> str | None:
    """The NVIDIA driver version string, or None without NVML."""
    value = query("nvmlSystemGetDriverVersion", default=None)
    return None if value is None else _text(value)


def device_name(index: int = 0) -> str:
    """The name of NVML device ``index`` ("NVIDIA H200"); "" if NVML cannot tell."""
    if not is_available():
        return ""
    handle = query("nvmlDeviceGetHandleByIndex", index, default=None)
    if handle is None:
        return ""
    return _text(query("nvmlDeviceGetName", handle, default=""))


def power_limit_w(index: int = 0) -> float | None:
    """The board's enforced power cap of NVML device ``index`` in W (``nvidia-smi``'s
    power.limit); None where NVML cannot tell."""
    if not is_available():
        return None
    handle = query("nvmlDeviceGetHandleByIndex", index, default=None)
    if handle is None:
        return None
    milliwatts = query("nvmlDeviceGetEnforcedPowerLimit", handle, default=None)
    return None if milliwatts is None else float(milliwatts) / 1000.0  # NVML reports mW


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def device_uuids() -> list[str]:
    """UUIDs (``GPU-…``) of the NVML devices in NVML index order; ``""`` where unreadable."""
    uuids = []
    for index in range(device_count()):
        handle = query("nvmlDeviceGetHandleByIndex", index, default=None)
        uuid = None if handle is None else query("nvmlDeviceGetUUID", handle, default=None)
        uuids.append("" if uuid is None else _text(uuid))
    return uuids


def map_cuda_visible_devices(visible: str | None, uuids: Sequence[str]) -> dict[int, int]:
    """CUDA ordinal → NVML index, for a ``CUDA_VISIBLE_DEVICES`` value and NVML's device UUIDs.

    ``visible`` None (unset) exposes every device in NVML (PCI bus) order. Otherwise each
    comma-separated entry is an NVML index or a (prefix of a) UUID, with or without ``GPU-``; as
    in CUDA, the list ends at the first entry that names no device, and a repeated device ends
    it too. MIG entries are not mapped (their parent GPU is ambiguous to NVML's index).

    # CUDA's default CUDA_DEVICE_ORDER is FASTEST_FIRST; it matches PCI order on machines with
    # identical GPUs, which is what pipeline training uses. Mixed GPUs need PCI_BUS_ID to map.
    """
    if visible is None:
        return {i: i for i in range(len(uuids))}
    mapping: dict[int, int] = {}
    for entry in (part.strip() for part in visible.split(",")):
        index = _resolve_entry(entry, uuids)
        if index is None or index in mapping.values():
            break
        mapping[len(mapping)] = index
    return mapping


def _resolve_entry(entry: str, uuids: Sequence[str]) -> int | None:
    if not entry:
        return None
    if entry.isdigit():
        index = int(entry)
        return index if index < len(uuids) else None
    if entry.startswith("MIG-"):
        return None
    prefix = entry if entry.startswith("GPU-") else f"GPU-{entry}"
    matches = [i for i, uuid in enumerate(uuids) if uuid and uuid.startswith(prefix)]
    return matches[0] if len(matches) == 1 else None


def cuda_to_nvml(environ: Mapping[str, str] | None = None) -> dict[int, int]:
    """CUDA ordinal → NVML index for this process (``{}`` without NVML)."""
    env = os.environ if environ is None else environ
    if env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") != "PCI_BUS_ID":
        log.debug("CUDA_DEVICE_ORDER is not PCI_BUS_ID; assuming PCI order (identical GPUs)")
    return map_cuda_visible_devices(env.get("CUDA_VISIBLE_DEVICES"), device_uuids())


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU's readings at one tick; NaN where NVML could not read a value."""

    index: int  # NVML index
    t_ns: int  # time.time_ns() when the tick began
    utilization_pct: float  # % of the last period with a kernel running (utilization.gpu)
    memory_used_bytes: float  # nvidia-smi memory.used
    memory_total_bytes: float  # nvidia-smi memory.total
    power_w: float  # nvidia-smi power.draw
    sm_clock_mhz: float  # nvidia-smi clocks.sm
    processes: tuple[tuple[int, int], ...] = ()  # (pid, used bytes) of compute processes
    cuda_ordinal: int | None = None  # this process's CUDA ordinal for the GPU, None if not visible


def read_samples(
    indices: Sequence[int] | None = None, *, t_ns: int | None = None
) -> list[GpuSample]:
    """Read every GPU (or ``indices``) once: one batched pass over NVML, ``[]`` without NVML."""
    if not is_available():
        return []
    now = time.time_ns() if t_ns is None else t_ns
    ordinal_of = {nvml_index: ordinal for ordinal, nvml_index in cuda_to_nvml().items()}
    targets = range(device_count()) if indices is None else indices
    samples = []
    for index in targets:
        handle = query("nvmlDeviceGetHandleByIndex", index, default=None)
        if handle is None:
            continue
        samples.append(_read_one(index, handle, now, ordinal_of.get(index)))
    return samples


def _read_one(index: int, handle: Any, t_ns: int, cuda_ordinal: int | None) -> GpuSample:
    util = query("nvmlDeviceGetUtilizationRates", handle, default=None)
    memory = query("nvmlDeviceGetMemoryInfo", handle, default=None)
    power_mw = query("nvmlDeviceGetPowerUsage", handle)
    clock_sm = query("nvmlDeviceGetClockInfo", handle, _STATE.module.NVML_CLOCK_SM)
    procs = query("nvmlDeviceGetComputeRunningProcesses", handle, default=())
    return GpuSample(
        index=index,
        t_ns=t_ns,
        utilization_pct=NAN if util is None else float(util.gpu),
        memory_used_bytes=NAN if memory is None else float(memory.used),
        memory_total_bytes=NAN if memory is None else float(memory.total),
        power_w=float(power_mw) / 1000.0,  # NVML reports milliwatts
        sm_clock_mhz=float(clock_sm),
        processes=tuple((int(p.pid), int(p.usedGpuMemory or 0)) for p in procs),
        cuda_ordinal=cuda_ordinal,
    )


SAMPLE_COLUMNS = [
    "t_ns",
    "index",
    "cuda_ordinal",
    "utilization_pct",
    "memory_used_bytes",
    "memory_total_bytes",
    "power_w",
    "sm_clock_mhz",
]


def samples_frame(samples: Sequence[GpuSample]) -> pd.DataFrame:
    """Samples as a DataFrame with the ordered columns ``SAMPLE_COLUMNS`` (processes dropped)."""
    import pandas as pd

    rows = [
        [
            s.t_ns,
            s.index,
            NAN if s.cuda_ordinal is None else float(s.cuda_ordinal),
            s.utilization_pct,
            s.memory_used_bytes,
            s.memory_total_bytes,
            s.power_w,
            s.sm_clock_mhz,
        ]
        for s in samples
    ]
    frame = pd.DataFrame(rows, columns=SAMPLE_COLUMNS)
    return frame.astype(
        {"t_ns": "int64", "index": "int64"} | dict.fromkeys(SAMPLE_COLUMNS[2:], "float64")
    )


class NvmlSampler:
    """Reads all GPUs every ``interval_s`` on a daemon thread into a bounded ring buffer.

    ``reader`` replaces :func:`read_samples` (tests feed fake samples); ``on_tick`` receives each
    tick's samples on the sampler thread (keep it short: it delays the next read).
    Without NVML, :meth:`start` starts no thread and :attr:`reason` says why.
    """

    def __init__(
        self,
        interval_s: float = 0.5,
        *,
        capacity: int = 3600,
        reader: Callable[[], list[GpuSample]] | None = None,
        on_tick: Callable[[list[GpuSample]], None] | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s={interval_s!r} must be > 0 (seconds between reads)")
        if capacity < 1:
            raise ValueError(f"capacity={capacity!r} must be >= 1 (samples kept)")
        self.interval_s = float(interval_s)
        self.capacity = capacity
        self.on_tick = on_tick
        self.ticks = 0
        self._reader = reader
        self._ring: collections.deque[GpuSample] = collections.deque(maxlen=capacity)
        self._latest: dict[int, GpuSample] = {}
        self._lock = threading.Lock()
        self._thread = BackgroundThread(self._run, name="freeride-nvml-sampler")

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<NvmlSampler interval_s={self.interval_s} {state} ticks={self.ticks}>"

    @property
    def available(self) -> bool:
        """True when there is something to sample (NVML present or a custom reader)."""
        return self._reader is not None or is_available()

    @property
    def reason(self) -> str | None:
        """Why nothing is sampled, or None."""
        return None if self.available else unavailable_reason()

    @property
    def running(self) -> bool:
        return self._thread.running

    def start(self) -> NvmlSampler:
        """Start the sampling thread (no-op when running or when nothing can be sampled)."""
        if self.available:
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the thread and wait up to ``timeout_s`` for it. Idempotent."""
        self._thread.stop(timeout_s)

    def __enter__(self) -> NvmlSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def tick(self) -> list[GpuSample]:
        """Read once, store the samples and call ``on_tick``; returns the samples."""
        samples = self._reader() if self._reader is not None else read_samples()
        with self._lock:
            self._ring.extend(samples)
            self._latest.update({s.index: s for s in samples})
            self.ticks += 1
        if self.on_tick is not None:
            self.on_tick(samples)
        return samples

    def samples(self) -> list[GpuSample]:
        """A copy of the ring buffer, oldest first."""
        with self._lock:
            return list(self._ring)

    def latest(self) -> dict[int, GpuSample]:
        """The newest sample per NVML index."""
        with self._lock:
            return dict(self._latest)

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except Exception:  # a dashboard must never kill its thread
                log.exception("GPU sampler tick failed; retrying in %.1f s", self.interval_s)
            stop.wait(self.interval_s)
