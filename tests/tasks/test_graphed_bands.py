"""The image task's band steps as CUDA graphs: the device-side band, its windows, the graphs."""

from __future__ import annotations

import pytest
import torch

from freeride_lab.tasks.graphed_bands import band_windows
from freeride_lab.tasks.image import (
    ImageTask,
    _columns,
    _resample,
    band_into,
    band_source_rows,
    column_blocks,
    lanczos_taps,
    make_source_image,
    resize_band,
)

SMALL = {"source_size": 48, "output_size": 96, "logo_size": 24, "margin": 4, "n_sources": 2}


def _eager_band(source: torch.Tensor, taps: object, columns: object, rows: slice) -> torch.Tensor:
    reads = band_source_rows(taps[0][0], rows)  # type: ignore[index]
    band = resize_band(source, taps, rows, reads, columns=columns)  # type: ignore[arg-type]
    return band.round_().clamp_(0, 255).to(torch.uint8)


@pytest.mark.parametrize(("output", "bands", "k"), [(96, 8, 1), (96, 8, 4), (90, 7, 2), (90, 7, 7)])
def test_a_band_made_from_a_start_on_the_device_is_the_eager_band_byte_for_byte(
    output: int, bands: int, k: int
) -> None:
    """Every start a step of k bands can have: the same bytes as ``resize_band``, in the
    window ``band_windows`` gives, and nothing written outside the band's rows."""
    source = make_source_image(48, seed=1)
    table = lanczos_taps(48, output)
    taps, columns = (table, table), column_blocks(table, 48)
    windows = band_windows(table[0], output, bands, (k,))
    for first in range(bands - k + 1):
        start, stop = first * output // bands, (first + k) * output // bands
        canvas = torch.full((3, output, output), 7, dtype=torch.uint8)
        window = windows[k, stop - start]
        band_into(canvas, source, table, columns, torch.tensor(start), stop - start, window)
        eager = _eager_band(source, taps, columns, slice(start, stop))
        assert torch.equal(canvas[:, start:stop], eager)
        assert (canvas[:, :start] == 7).all() and (canvas[:, stop:] == 7).all()


@pytest.mark.parametrize(("n_in", "n_out"), [(64, 256), (48, 90), (100, 37), (16, 16)])
def test_columns_in_blocks_resample_as_tap_by_tap(n_in: int, n_out: int) -> None:
    """One gather and one batched product per pass give the tap-by-tap columns (to float
    rounding), enlarging, shrinking, at a width with no large power of two, and the same."""
    table = lanczos_taps(n_in, n_out)
    rows = torch.rand(5, n_in, generator=torch.Generator().manual_seed(0)) * 255
    blocks = _columns(rows, column_blocks(table, n_in))
    assert torch.allclose(blocks, _resample(rows, table, dim=1), atol=2e-4)


def test_windows_cover_every_band_a_step_size_meets() -> None:
    table = lanczos_taps(64, 250)[0]
    windows = band_windows(table, 250, 8, (1, 2, 4))
    assert set(windows) == {(1, 31), (1, 32), (2, 62), (2, 63), (4, 125)}
    for (k, n), window in windows.items():
        spans = [
            band_source_rows(table, slice(b * 250 // 8, (b + k) * 250 // 8))
            for b in range(8 - k + 1)
            if (b + k) * 250 // 8 - b * 250 // 8 == n
        ]
        assert window == max(hi - lo for lo, hi in spans) < 64  # not the whole image


def test_cuda_graphs_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="cuda_graphs='yes' must be True or False"):
        ImageTask(**SMALL, bands=4, cuda_graphs="yes")


def _images(device: str, n: int, **options: object) -> list[torch.Tensor]:
    task = _ready(device, **options)
    out = []
    while task.images_done < n:
        sizes = task.step_sizes
        task.step(sizes[(task.images_done + task._band) % len(sizes)])  # a mix of sizes
        if task._band == 0:
            out.append(task.last_output.cpu())
    return out


def test_cuda_graphs_with_one_band_an_image_makes_it_eagerly() -> None:
    graphed, eager = _ready("cpu", cuda_graphs=True), _ready("cpu")
    assert graphed.step() == eager.step() == 1.0
    assert torch.equal(graphed.last_output, eager.last_output) and graphed._graphs is None


def _ready(device: str, **options: object) -> ImageTask:
    """An image task of ``SMALL`` and ``options``, set up on ``device``."""
    task = ImageTask(**{**SMALL, **options})
    task.setup()
    task.to_device(device)
    return task


def test_cuda_graphs_on_a_cpu_changes_nothing() -> None:
    options = {"bands": 6, "step_bands": 4}
    graphed, eager = _images("cpu", 2, **options, cuda_graphs=True), _images("cpu", 2, **options)
    assert all(torch.equal(a, b) for a, b in zip(graphed, eager, strict=True))


@pytest.mark.gpu
def test_graphed_bands_make_the_eager_images_byte_for_byte() -> None:
    options = {"source_size": 512, "output_size": 2048, "logo_size": 256, "margin": 32,
               "bands": 16, "step_bands": 8, "n_sources": 3}  # fmt: skip
    graphed = _images("cuda", 3, **options, cuda_graphs=True)
    eager = _images("cuda", 3, **options)
    assert len(graphed) == 3 and all(torch.equal(a, b) for a, b in zip(graphed, eager, strict=True))
    single = _images("cuda", 3, **{**options, "step_bands": 1})  # more rows, other sums
    for a, b in zip(graphed, single, strict=True):
        assert (a.int() - b.int()).abs().max() <= 1


@pytest.mark.gpu
def test_graphs_are_captured_at_the_first_band_and_dropped_by_a_move() -> None:
    task = ImageTask(**SMALL, bands=8, step_bands=2, cuda_graphs=True)
    task.setup()
    task.to_device("cuda")
    task.step()
    assert task._graphs is not None and set(task._graphs.keys) == {(1, 12), (2, 24)}
    with pytest.raises(KeyError, match=r"no graph for 4 band\(s\) of 48 rows"):
        task._graphs.run(4, 0, 48)
    task.to_host()
    assert task._graphs is None and task._graph_canvas is None
    task.to_device("cuda")
    for _ in range(8):
        task.step()
    assert task.images_done == 1 and task._graphs is not None
