"""A band step of the image task on a GPU: channel by channel, all channels at once, the
columns in blocks, graphed.

The image task's GPU preset (4096² sources, 16384² outputs) in 128 bands: a step of k bands
resizes 128·k output rows (``tasks.image.resize_band``) and writes them into the image in
progress, timed from the first launch to ``torch.cuda.synchronize()`` as the task host times
a step, and to the last launch's return (the host's own part). Two ways, each over 50 bands
at spread-out bands after 10 left out, k = 1, 2, 4, 8: "per_channel" resizes one channel at a
time from the whole source channel in float (the task before 2026-12-06, kept here as its
few lines), "all_channels" is ``resize_band`` tap by tap (one gather and one multiply-add
per tap for all channels, over the band's own input rows; the task from 2026-12-06),
"blocks" the same with the column pass as one gather and one batched product
(``tasks.image.column_blocks``, the task's eager step now), "graphed" that step replayed as a
CUDA graph (``tasks.graphed_bands``, the task with ``cuda_graphs``: one fill and one replay).
Reported per way and k: the median and 90th percentile of the step time and the median launch
time (ms); whether channel by channel and all channels at once give the same band bit for
bit, the graphed band the eager blocks' bit for bit, and how far the blocks' band lies from
the tap-by-tap one (the largest difference in float, and the share of pixels whose uint8
value differs).

    python benchmarks/bench_image_bands.py --out image-bands.json
"""

from __future__ import annotations

import argparse
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from bench_output import write_results

from freeride_lab.tasks import image as im
from freeride_lab.tasks.graphed_bands import GraphedBands, band_windows

SOURCE, OUTPUT, BANDS = 4096, 16384, 128
KEPT, LEFT_OUT = 50, 10


def per_channel_band(image: torch.Tensor, taps: Any, rows: slice) -> torch.Tensor:
    """A band as the task made it before: each channel from its whole source in float."""
    (row_index, row_weight), cols = taps
    band_rows = (row_index[rows], row_weight[rows])
    out = torch.empty(image.shape[0], band_rows[0].shape[0], cols[0].shape[0], device=image.device)
    for c in range(image.shape[0]):
        out[c] = im._resample(im._resample(image[c].float(), band_rows, dim=0), cols, dim=1)
    return out


def measure(way: str, bands: int, src: torch.Tensor, taps: Any, host_index: torch.Tensor,
            columns: Any, canvas: torch.Tensor,
            graphs: GraphedBands) -> dict[str, float]:  # fmt: skip
    """Median and p90 step time and median launch time (ms) of ``bands``-band steps."""
    n = bands * OUTPUT // BANDS
    times, launch = [], []
    for k in range(KEPT + LEFT_OUT):
        start = (k * 8) % (BANDS - bands) * (OUTPUT // BANDS)
        rows = slice(start, start + n)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if way == "graphed":
            graphs.run(bands, start, start + n)
        else:
            if way == "per_channel":
                band = per_channel_band(src, taps, rows)
            else:
                reads = im.band_source_rows(host_index, rows)
                cols = columns if way == "blocks" else None
                band = im.resize_band(src, taps, rows, reads, columns=cols)
            canvas[:, rows] = band.round_().clamp_(0, 255).to(torch.uint8)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        if k >= LEFT_OUT:
            times.append((t2 - t0) * 1e3)
            launch.append((t1 - t0) * 1e3)
    times.sort()
    launch.sort()
    return {
        "median_ms": times[len(times) // 2],
        "p90_ms": times[int(len(times) * 0.9)],
        "launch_median_ms": launch[len(launch) // 2],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    src = im.make_source_image(SOURCE, seed=0).to("cuda")
    table = im.lanczos_taps(SOURCE, OUTPUT)
    taps = (tuple(t.to("cuda") for t in table),) * 2
    canvas = torch.empty(3, OUTPUT, OUTPUT, dtype=torch.uint8, device="cuda")
    columns = tuple(t.to("cuda") for t in im.column_blocks(table, SOURCE))
    windows = band_windows(table[0], OUTPUT, BANDS, (1, 2, 4, 8))
    step = partial(im.band_into, canvas, src, taps[0], columns)
    graphs = GraphedBands(step, windows, src.device)
    record: dict[str, Any] = {}
    for way in ("per_channel", "all_channels", "blocks", "graphed"):
        for bands in (1, 2, 4, 8):
            record[f"{way}/{bands}"] = measure(
                way, bands, src, taps, table[0], columns, canvas, graphs
            )
            print(way, bands, record[f"{way}/{bands}"], flush=True)
    rows = slice(4096, 4096 + 8 * OUTPUT // BANDS)
    tap_by_tap = im.resize_band(src, taps, rows)
    record["equal"] = bool(torch.equal(per_channel_band(src, taps, rows), tap_by_tap))
    blocks = im.resize_band(src, taps, rows, columns=columns)
    record["blocks_max_abs_diff"] = float((blocks - tap_by_tap).abs().max())
    levels = [b.round().clamp(0, 255).to(torch.uint8) for b in (blocks, tap_by_tap)]
    record["blocks_uint8_differ_frac"] = float((levels[0] != levels[1]).float().mean())
    graphs.run(8, rows.start, rows.stop)
    record["graphed_equal"] = bool(torch.equal(canvas[:, rows], levels[0]))
    record["device"] = torch.cuda.get_device_name()
    write_results(record, args.out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
