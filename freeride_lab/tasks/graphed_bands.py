"""The image task's band steps replayed as CUDA graphs: one replay instead of dozens of launches.

[Note: graphed bands]
A band step of the image task's GPU preset (``tasks.image`` [Note: image bands]) launches
about forty small kernels: per tap of each separable pass a gather and a multiply-add, then
the rounding and the write into the image in progress. On an H100 the launches took 0.60 ms
of a one-band step's 0.63 ms once its columns were one batched product ([Note: columns in
blocks] in ``tasks.image``), and a step's guard scales with its time, so the thinnest step,
the one meant for the shortest bubbles and the last milliseconds of the others, was the one
the host's launches set. Replayed, it took 0.28 ms (BENCHMARKS.md, table
``image-bands-h100-12-07f``).

A graph replays fixed shapes at fixed addresses, and a band's rows move from step to step.
So the recorded step reads where it works from the device: the band's first output row is a
one-element tensor set before each replay (``GraphedBands.run``: one fill and one replay),
and the step (``tasks.image.band_into``) computes from it the band's rows, their row-table
entries and the input rows they read: a window as tall as the tallest any step of that many
rows reads (``band_windows``), so every start fits. The band goes into the image in progress,
one canvas allocated once, by ``index_copy_``; the source being banded is copied into one
buffer at each image's first band. The kernels are the eager step's, on the same values in the
same order, so a graphed band is the eager band bit for bit.

One graph per (bands a step, output rows), every one the task's step sizes can meet captured at
once at an image's first band (capture records without running; each is run once on a side
stream first, as torch's recipe has it, writing rows the image's own bands write again). The
graphs share one memory pool: they run one after another on the caller's stream and none
leaves a tensor alive in it. Anything that replaces the tensors they refer to (moving the
task) drops them; the next image's first band captures them again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch

__all__ = ["BandKey", "GraphedBands", "band_windows"]

#: A graph's shape: (bands a step takes, output rows they make).
BandKey = tuple[int, int]
#: Records one band step: (the device tensor holding its first output row, rows, window).
BandStep = Callable[[torch.Tensor, int, int], None]


def band_windows(
    row_index: torch.Tensor, output_size: int, bands: int, sizes: Iterable[int]
) -> dict[BandKey, int]:
    """For every step of ``k`` in ``sizes`` bands an image of ``bands`` can take: the most
    input rows a step of its (k, output rows) reads, from the host's row table ``row_index``
    (output_size, taps).

        >>> from freeride_lab.tasks.image import lanczos_taps
        >>> index, _ = lanczos_taps(64, 256)  # 8 bands of 32 rows: 8 input rows and the taps
        >>> band_windows(index, 256, 8, (1, 2))
        {(1, 32): 15, (2, 64): 23}
        >>> band_windows(lanczos_taps(64, 250)[0], 250, 8, (1,))  # bands of 31 and 32 rows
        {(1, 31): 15, (1, 32): 15}
    """
    lows, highs = row_index.amin(dim=1).tolist(), row_index.amax(dim=1).tolist()  # per row
    windows: dict[BandKey, int] = {}
    for k in sorted(set(sizes)):
        for first in range(bands - k + 1):
            start, stop = first * output_size // bands, (first + k) * output_size // bands
            key = (k, stop - start)
            windows[key] = max(windows.get(key, 0), highs[stop - 1] + 1 - lows[start])
    return dict(sorted(windows.items()))


class GraphedBands:
    """The CUDA graphs of one image task's band steps (see [Note: graphed bands]).

    Args:
        step: records one band step given the device tensor of its first output row, its
            output rows and its input window (``tasks.image.band_into`` bound to the task's
            buffers).
        windows: the steps to capture, (bands, rows) → window (``band_windows``).
        device: the CUDA device of the task's buffers.
    """

    def __init__(
        self, step: BandStep, windows: Mapping[BandKey, int], device: torch.device
    ) -> None:
        self.device = device
        self._start = torch.zeros((), dtype=torch.int64, device=device)
        self._pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[BandKey, torch.cuda.CUDAGraph] = {}
        for key, window in windows.items():
            self._graphs[key] = self._capture(step, key[1], window)

    def __repr__(self) -> str:
        keys = ", ".join(f"{k}x{n}" for k, n in self._graphs)
        return f"GraphedBands(device={str(self.device)!r}, graphs=[{keys}])"

    @property
    def keys(self) -> tuple[BandKey, ...]:
        """The (bands, rows) of every graph captured."""
        return tuple(self._graphs)

    def run(self, bands: int, start: int, stop: int) -> None:
        """Make output rows ``start:stop`` (``bands`` bands) by their graph's replay.

        Raises:
            KeyError: no graph of that many bands and rows (not one ``band_windows`` gave).
        """
        graph = self._graphs.get((bands, stop - start))
        if graph is None:
            raise KeyError(
                f"no graph for {bands} band(s) of {stop - start} rows; captured: {self.keys}"
            )
        self._start.fill_(start)
        graph.replay()

    def _capture(self, step: BandStep, rows: int, window: int) -> torch.cuda.CUDAGraph:
        """Run one band step on a side stream (torch's warm-up before a capture), then record
        it; the recording runs nothing."""
        self._start.fill_(0)
        side = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            step(self._start, rows, window)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the task host's other threads may query events while this one captures
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            step(self._start, rows, window)
        return graph
