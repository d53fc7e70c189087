"""Image-processing side task: Lanczos resize plus an alpha-blended watermark, one image a step.

FreeRide's image task decoded a JPEG (nvJPEG), resized it to 16384² with NPP's Lanczos filter,
alpha-blended a watermark and encoded the result (paper §12). Here the decoded images are
generated (nothing is read or downloaded) and the resize and blend are torch ops, so they run
on CPU or any GPU; encoding is left out (torch has no JPEG encoder without torchvision)::

    >>> task = ImageTask(source_size=64, output_size=128, logo_size=32, margin=4)
    >>> task.setup(); task.to_device("cpu")
    >>> task.step()
    1.0
    >>> tuple(task.last_output.shape), task.last_output.dtype
    ((3, 128, 128), torch.uint8)

[Note: separable Lanczos resampling]
Output pixel i along an axis of ``n_in`` → ``n_out`` pixels samples the input at
``c_i = (i + ½)·n_in/n_out - ½`` (pixel centres, as ``align_corners=False``). Its weights are
``L((j - c_i)/s)`` over the input pixels j within ``a·s`` of ``c_i``, where
``L(x) = sinc(x)·sinc(x/a)`` for |x| < a (Lanczos-``a``, a = 3 as NPP's ``NPPI_INTER_LANCZOS``)
and ``s = max(1, n_in/n_out)`` widens the kernel when shrinking (antialiasing). Weights are
normalised to sum to 1, so a constant image stays constant; indices past an edge repeat the
edge pixel. The tables are (n_out, taps) index and weight tensors built once per size; a pass
is ``taps`` gathers (``index_select``) and fused multiply-adds, one channel at a time to bound
the memory of 16384² outputs. Rows and columns are resized in whichever order costs less.

[Note: image bands]
A 16384² output is one large step (tens of ms on an H200), longer than many bubbles. With
``bands=k`` a step resizes one band of ``output_size/k`` output rows (rows first: the band's
row table is a slice of the whole image's), so every step costs the same and fits a short
bubble; the watermark is blended once the last band is done. Progress counts images by the
share of their rows made: a step of k bands of an image in b returns k / b, so a bubble's work
is counted in it, not in whichever later bubble ends the image (counted only at an image's end,
a side task that finishes an image or two per second reads 0 in one window of a second and 2
in the next). A checkpoint keeps whole images only (``images_done`` and the progress they
make): a half-done image is redone from its first band after a restore, and its share counted
again then.

With ``step_bands=m`` (at most ``bands``) one step may take several bands at once: the task
offers steps of 1, 2, 4, ... bands, up to m and to the bands its image has left
(``step_sizes``), and the task host takes, in each bubble, the largest whose guard still fits
what is left of it (``sidetasks.host.iterative`` [Note: step sizes]). So fine bands fill the
short bubbles and the last milliseconds of every bubble, and a long bubble is taken in a few
large steps; a step of k bands is one resize of their rows, the same pixels k steps of one
band would make (on a GPU to float rounding: a batched product over more rows may sum in
another order, [Note: columns in blocks]).

[Note: columns in blocks]
Tap by tap, a band's column pass writes and reads the whole band in float once per tap (a
gather, then a multiply-add), the GPU's memory, not its arithmetic, the bound. A column
table is a banded matrix: the outputs of a block of adjacent columns read one short window
of input columns. So ``column_blocks`` cuts the output width into blocks (256 columns for
the GPU preset: 64 blocks, each reading 71 input columns) and keeps each block's weights as a
dense (window, block) matrix, with the weights of taps that an edge clamps onto one pixel
summed; the pass is then one gather of every block's window and one batched matrix product
(``_columns``). On an H100 an 8-band step took 1.92 ms this way, 4.42 ms tap by tap
(BENCHMARKS.md, table ``image-bands-h100-12-07f``). The products run in
float32 (torch's default; TF32 is never switched on here), so a band differs from the tap by
tap one by float rounding only (within 5e-5 of a level on the GPU preset, before the rounding
to uint8; no pixel of the bench's 8-band step changed). The row
pass stays tap by tap: it works on the band's few input rows.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from freeride_lab.sidetasks.api import doubling_sizes
from freeride_lab.tasks.device import HostReturningTask
from freeride_lab.tasks.graphed_bands import GraphedBands, band_windows
from freeride_lab.tasks.options import check_choice, check_float, check_int, resolve_options

__all__ = [
    "COLUMN_BLOCK",
    "METHODS",
    "POSITIONS",
    "ColumnBlocks",
    "ImageOptions",
    "ImageTask",
    "alpha_blend",
    "band_into",
    "band_source_rows",
    "column_blocks",
    "lanczos_taps",
    "make_logo",
    "make_source_image",
    "resize",
    "resize_band",
    "watermark_origin",
]

#: Resampling filters ``resize`` knows.
METHODS: tuple[str, ...] = ("lanczos", "bicubic")
#: A Lanczos table for one axis: (n_out, taps) int64 input pixels, (n_out, taps) float32 weights.
Taps = tuple[torch.Tensor, torch.Tensor]
#: A column table as blocks (``column_blocks``): (blocks · window,) int64 input columns and
#: (blocks, window, block) float32 weights.
ColumnBlocks = tuple[torch.Tensor, torch.Tensor]
#: Output columns a block of ``column_blocks`` makes ([Note: columns in blocks]).
COLUMN_BLOCK = 256
#: Where the watermark goes.
POSITIONS: tuple[str, ...] = ("bottom-right", "bottom-left", "top-right", "top-left", "center")


@dataclass(frozen=True, kw_only=True)
class ImageOptions:
    """Sizes and watermark of the image task; the defaults are the "cpu" preset."""

    source_size: int = 512  # px, side of each generated (decoded) input image
    output_size: int = 1024  # px, side after resizing (FreeRide: 16384)
    method: str = "lanczos"  # "lanczos" (Lanczos-3, as NPP) or "bicubic" (antialiased)
    logo_size: int = 128  # px, side of the RGBA watermark
    position: str = "bottom-right"  # one of POSITIONS
    margin: int = 16  # px between the watermark and the image edges
    alpha: float = 0.5  # watermark opacity multiplier, 0 (invisible) to 1 (logo's own alpha)
    n_sources: int = 4  # distinct generated input images, cycled
    seed: int = 0
    max_images: int | None = None  # is_finished() after this many images; None: never
    bands: int = 1  # steps per image, one band of output rows each (see [Note: image bands])
    step_bands: int = 1  # the most bands one step may take (1, 2, 4, ...; [Note: image bands])
    #: on a GPU, replay band steps (bands > 1) as CUDA graphs ([Note: graphed bands]); an image
    #: in one step runs eagerly, as on a CPU
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        check_int("source_size", self.source_size, minimum=8)
        check_int("output_size", self.output_size, minimum=8)
        check_choice("method", self.method, METHODS)
        check_int("logo_size", self.logo_size)
        check_choice("position", self.position, POSITIONS)
        check_int("margin", self.margin, minimum=0)
        check_float("alpha", self.alpha, low=0.0, high=1.0)
        check_int("n_sources", self.n_sources)
        check_int("seed", self.seed, minimum=0)
        check_int("max_images", self.max_images, optional=True)
        check_int("bands", self.bands)
        check_int("step_bands", self.step_bands)
        if not isinstance(self.cuda_graphs, bool):
            raise TypeError(f"cuda_graphs={self.cuda_graphs!r} must be True or False")
        if self.step_bands > self.bands:
            raise ValueError(
                f"step_bands={self.step_bands} > bands={self.bands}: a step cannot take more "
                "bands than an image has; raise bands or lower step_bands"
            )
        if self.bands > self.output_size:
            raise ValueError(
                f"bands={self.bands} > output_size={self.output_size}: a band needs at least "
                "one row of output; use fewer bands"
            )
        if self.bands > 1 and self.method != "lanczos":
            raise ValueError(
                f"bands={self.bands} needs method='lanczos' (a band is a slice of its row "
                "table); use bands=1 with method='bicubic'"
            )
        if self.logo_size + 2 * self.margin > self.output_size:
            raise ValueError(
                f"logo_size={self.logo_size} + 2·margin={2 * self.margin} > "
                f"output_size={self.output_size}: the watermark does not fit; shrink it"
            )


def make_source_image(size: int, *, seed: int = 0) -> torch.Tensor:
    """A deterministic stand-in for a decoded photo: smooth colour gradients plus noise.

    Returns:
        (3, size, size) uint8.
    """
    g = torch.Generator().manual_seed(seed)
    phase, freq = torch.rand(3, generator=g) * 2 * math.pi, 1 + 3 * torch.rand(3, generator=g)
    ramp = torch.linspace(0.0, 1.0, size)
    y, x = ramp[:, None], ramp[None, :]  # (S, 1), (1, S)
    image = torch.empty(3, size, size)
    image[0] = 255 * (0.2 + 0.6 * x) * (0.7 + 0.3 * y)
    image[1] = 128 + 100 * torch.sin(2 * math.pi * freq[1] * (x + y) / 2 + phase[1])
    image[2] = 128 + 90 * torch.cos(2 * math.pi * freq[2] * (x - y) + phase[2]) * y
    image += 6.0 * torch.randn(3, size, size, generator=g)
    return image.round_().clamp_(0, 255).to(torch.uint8)


def make_logo(size: int) -> torch.Tensor:
    """The watermark: an opaque disc with an antialiased 1-px rim and a colour gradient.

    Returns:
        (4, size, size) uint8 RGBA; alpha is 255 inside the disc and 0 in the corners.
    """
    centre, radius = (size - 1) / 2, size / 2 - 1
    coords = torch.arange(size, dtype=torch.float32) - centre
    r = torch.sqrt(coords[:, None] ** 2 + coords[None, :] ** 2)  # (L, L) px from the centre
    rel = (r / max(radius, 1.0)).clamp(max=1.0)
    logo = torch.empty(4, size, size)
    logo[0] = 250.0
    logo[1] = 60 + 160 * (1 - rel)
    logo[2] = 40 + 80 * rel
    logo[3] = 255 * (radius + 0.5 - r).clamp(0.0, 1.0)
    return logo.round_().to(torch.uint8)


def lanczos_taps(in_size: int, out_size: int, *, a: int = 3) -> Taps:
    """Lanczos-``a`` resampling table for one axis (see [Note: separable Lanczos resampling]).

    Returns:
        index (out_size, taps) int64 input pixels and weight (out_size, taps) float32, each
        row summing to 1.
    """
    scale = in_size / out_size
    stretch = max(scale, 1.0)  # > 1 when shrinking: widen the kernel to low-pass
    support = a * stretch  # input px either side of the centre
    taps = math.ceil(2 * support) + 1
    centre = (torch.arange(out_size, dtype=torch.float64) + 0.5) * scale - 0.5  # (out,)
    first = torch.floor(centre - support) + 1  # (out,)
    index = first[:, None] + torch.arange(taps, dtype=torch.float64)  # (out, taps)
    x = (index - centre[:, None]) / stretch  # (out, taps) in kernel units
    weight = torch.where(x.abs() < a, torch.sinc(x) * torch.sinc(x / a), 0.0)
    weight /= weight.sum(dim=1, keepdim=True)
    return index.long().clamp_(0, in_size - 1), weight.float()


def resize(
    image: torch.Tensor,
    size: tuple[int, int],
    *,
    method: str = "lanczos",
    taps: tuple[Taps, Taps] | None = None,
) -> torch.Tensor:
    """Resize a float (C, H, W) image to ``size`` = (height, width) px.

    Args:
        method: "lanczos" (Lanczos-3) or "bicubic" (``F.interpolate``, antialiased).
        taps: precomputed ``(lanczos_taps(H, height), lanczos_taps(W, width))`` on the
            image's device, to skip rebuilding them for every image of one size.

    Returns:
        (C, height, width) float32; values may overshoot the input range slightly.
    """
    if method == "bicubic":
        out = F.interpolate(
            image[None].float(), size=size, mode="bicubic", align_corners=False, antialias=True
        )
        return out[0]  # (C, height, width)
    if method != "lanczos":
        raise ValueError(f"method={method!r} is unknown; valid: {', '.join(map(repr, METHODS))}")
    _, in_h, in_w = image.shape
    out_h, out_w = size
    if taps is None:
        taps = (
            _taps_to(lanczos_taps(in_h, out_h), image.device),
            _taps_to(lanczos_taps(in_w, out_w), image.device),
        )
    rows, cols = taps
    n_rows, n_cols = rows[0].shape[1], cols[0].shape[1]
    # gathered elements per order; a column gather is strided, so it counts double
    rows_first = out_h * in_w * n_rows + 2 * out_h * out_w * n_cols
    cols_first = 2 * in_h * out_w * n_cols + out_h * out_w * n_rows
    out = torch.empty(image.shape[0], out_h, out_w, device=image.device)
    for c in range(image.shape[0]):  # one channel at a time bounds temporaries
        channel = image[c].float()  # (H, W)
        if rows_first <= cols_first:
            out[c] = _resample(_resample(channel, rows, dim=0), cols, dim=1)
        else:
            out[c] = _resample(_resample(channel, cols, dim=1), rows, dim=0)
    return out


def resize_band(
    image: torch.Tensor,
    taps: tuple[Taps, Taps],
    rows: slice,
    source_rows: tuple[int, int] | None = None,
    *,
    columns: ColumnBlocks | None = None,
) -> torch.Tensor:
    """Output rows ``rows`` of a Lanczos resize of a (C, H, W) image, rows first.

    Args:
        taps: the whole output's ``(row table, column table)``, as ``resize`` takes them.
        rows: the band, ``slice(start, stop)`` of output row indices.
        source_rows: the input rows the band reads, ``(first, stop)`` (``band_source_rows``
            on a host copy of the row table); None reads them off ``taps``, which waits for
            a device that holds the table.
        columns: the column table as blocks (``column_blocks``), to resize the columns as
            one batched product ([Note: columns in blocks]); None: tap by tap, as ``resize``.

    Returns:
        (C, stop - start, width) float32, equal to those rows of ``resize`` up to float
        rounding (``resize`` may take the other order).
    """
    (row_index, row_weight), cols = taps
    index, weight = row_index[rows], row_weight[rows]  # (n, taps) each
    lo, hi = source_rows if source_rows is not None else band_source_rows(row_index, rows)
    source = image[:, lo:hi].float()  # (C, hi - lo, W): only the rows the band reads
    band = _resample(source, (index - lo, weight), dim=1)  # (C, n, W), all channels at once
    c, n, w = band.shape
    # the columns as one (C·n, W) matrix's: on a CPU a gather along a 3-d tensor's last dim
    # runs about ten times slower than along a matrix's
    flat = band.reshape(c * n, w)
    out = _resample(flat, cols, dim=1) if columns is None else _columns(flat, columns)
    return out.reshape(c, n, -1)  # (C, n, width)


def band_into(
    canvas: torch.Tensor,
    image: torch.Tensor,
    row_table: Taps,
    columns: ColumnBlocks,
    start: torch.Tensor,
    rows: int,
    window: int,
) -> None:
    """Write output rows ``start:start + rows`` of a Lanczos resize of ``image`` into
    ``canvas`` (C, O, O) uint8, with ``start`` a one-element int64 tensor on their device.

    ``resize_band`` with ``columns`` and the canvas write of ``ImageTask``, made without
    reading anything back to the host, so a CUDA graph can replay it for any start ([Note:
    graphed bands] in ``tasks.graphed_bands``): the band's entries of ``row_table`` and the
    ``window`` input rows from its first (at least the rows any band of ``rows`` rows reads;
    ``band_windows``) are gathered on the device. The same kernels on the same values as
    ``resize_band``, so the same bytes.
    """
    row_index, row_weight = row_table
    out_rows = start + torch.arange(rows, device=canvas.device)  # (n,)
    index = row_index.index_select(0, out_rows)  # (n, taps)
    weight = row_weight.index_select(0, out_rows)
    lo = index[0, :1]  # (1,) the band's first input row: the first tap of its first row
    reads = (lo + torch.arange(window, device=canvas.device)).clamp_(max=image.shape[1] - 1)
    band = _resample(image.index_select(1, reads).float(), (index - lo, weight), dim=1)
    c, n, w = band.shape
    out = _columns(band.reshape(c * n, w), columns).reshape(c, n, -1)
    canvas.index_copy_(1, out_rows, out.round_().clamp_(0, 255).to(torch.uint8))


def column_blocks(table: Taps, in_size: int, most: int = COLUMN_BLOCK) -> ColumnBlocks:
    """A column table (``lanczos_taps``) as blocks of output columns, as many as the
    greatest common divisor of the width and ``most``: the input columns each block reads, a
    window as wide as the widest block's, and each block's weights as a dense (window,
    block) matrix ([Note: columns in blocks]).

        >>> reads, dense = column_blocks(lanczos_taps(64, 256), 64, most=32)
        >>> tuple(dense.shape), tuple(reads.shape)  # 8 blocks of 8 input columns and the taps
        ((8, 15, 32), (120,))
        >>> bool(torch.allclose(dense.sum(dim=1), torch.ones(8, 32)))  # each column's weights
        True

    Returns:
        (blocks · window,) int64 input columns, block by block, and (blocks, window, block)
        float32 weights, on the host.
    """
    index, weight = table  # (n_out, taps)
    n_out, taps = index.shape
    block = math.gcd(n_out, most)
    blocks = n_out // block
    by_block = index.view(blocks, block, taps)
    low = by_block.amin(dim=(1, 2))
    window = int((by_block.amax(dim=(1, 2)) + 1 - low).max())
    first = low.clamp(max=in_size - window)  # the window stays inside the input
    local = by_block - first[:, None, None]  # (blocks, block, taps) within the window
    dense = torch.zeros(blocks, window, block)
    where = (
        torch.arange(blocks)[:, None, None].expand_as(local),
        local,
        torch.arange(block)[None, :, None].expand_as(local),
    )
    dense.index_put_(where, weight.view(blocks, block, taps), accumulate=True)
    reads = (first[:, None] + torch.arange(window)).reshape(-1)
    return reads, dense


def _columns(rows: torch.Tensor, columns: ColumnBlocks) -> torch.Tensor:
    """Resample the columns of (R, W) float ``rows`` by ``column_blocks``: one gather of
    every block's window and one batched product ([Note: columns in blocks]); (R, width)."""
    reads, dense = columns
    blocks, window, block = dense.shape
    gathered = rows.index_select(1, reads).view(-1, blocks, window).transpose(0, 1)
    out = torch.bmm(gathered, dense)  # (blocks, R, block)
    return out.transpose(0, 1).reshape(rows.shape[0], blocks * block)


def _taps_to(taps: Taps, device: torch.device | str) -> Taps:
    return taps[0].to(device), taps[1].to(device)


def _resample(channel: torch.Tensor, table: Taps, *, dim: int) -> torch.Tensor:
    """Resample a float tensor (a (H, W) channel, a (C, H, W) image) along ``dim`` with an
    (n_out, taps) table: one gather and one multiply-add per tap."""
    index, weight = table  # (n_out, taps), (n_out, taps)
    shape = list(channel.shape)
    shape[dim] = index.shape[0]
    out = torch.zeros(shape, device=channel.device)  # n_out along dim
    along = [-1 if d == dim else 1 for d in range(channel.dim())]  # a tap's weights, along dim
    for t in range(index.shape[1]):
        out.addcmul_(channel.index_select(dim, index[:, t]), weight[:, t].reshape(along))
    return out


def band_source_rows(row_index: torch.Tensor, rows: slice) -> tuple[int, int]:
    """The input rows ``(first, stop)`` that output rows ``rows`` of a row table read: a
    row's taps start no earlier than the row before's, so the band's first and last rows
    bound them.

        >>> index, _ = lanczos_taps(8, 32)
        >>> band_source_rows(index, slice(0, 4)), band_source_rows(index, slice(28, 32))
        ((0, 5), (4, 8))
    """
    first, last = row_index[rows.start], row_index[rows.stop - 1]
    return int(first.min()), int(last.max()) + 1


def watermark_origin(
    image_size: tuple[int, int], logo_size: int, position: str, margin: int
) -> tuple[int, int]:
    """(top, left) px of the watermark for ``position`` in an image of (height, width) px."""
    height, width = image_size
    bottom, right = height - margin - logo_size, width - margin - logo_size
    origins = {
        "top-left": (margin, margin),
        "top-right": (margin, right),
        "bottom-left": (bottom, margin),
        "bottom-right": (bottom, right),
        "center": ((height - logo_size) // 2, (width - logo_size) // 2),
    }
    if position not in origins:
        raise ValueError(
            f"position={position!r} is unknown; valid: {', '.join(map(repr, POSITIONS))}"
        )
    return origins[position]


def alpha_blend(
    image: torch.Tensor, logo: torch.Tensor, *, top: int, left: int, alpha: float = 1.0
) -> torch.Tensor:
    """Blend an RGBA ``logo`` (4, h, w) uint8 into ``image`` (3, H, W) uint8, in place.

    Each pixel of the covered region becomes ``round(image + (logo_rgb - image)·a)`` with
    ``a = alpha · logo_alpha / 255``: ``alpha=0`` leaves the image as it was, and ``alpha=1``
    puts the logo's colour wherever the logo is opaque.

    Returns:
        ``image``.
    """
    _, h, w = logo.shape
    region = image[:, top : top + h, left : left + w]  # (3, h, w) view
    if region.shape[1:] != (h, w) or top < 0 or left < 0:
        raise ValueError(
            f"logo of {h}x{w} px at (top={top}, left={left}) leaves the "
            f"{image.shape[1]}x{image.shape[2]} image; move or shrink it"
        )
    a = logo[3:].float() * (alpha / 255.0)  # (1, h, w)
    blended = region.float()
    blended += (logo[:3].float() - blended) * a
    region.copy_(blended.round_().clamp_(0, 255))
    return image


class ImageTask(HostReturningTask):
    """Resize a generated image and watermark it; one step = one image (unit: images)."""

    unit: ClassVar[str] = "images"
    state_dict_is_copy: ClassVar[bool] = True  # counters only
    #: Key of FreeRide's reference throughput (paper §13) for cost accounting.
    reference_key: ClassVar[str] = "image"
    cpu_defaults: ClassVar[Mapping[str, Any]] = MappingProxyType({})
    #: preset="gpu": FreeRide's 16384² outputs (inputs of 4096² stand for decoded photos), in
    #: 16 bands so one step is a few ms on an H200 (see [Note: image bands]).
    gpu_defaults: ClassVar[Mapping[str, Any]] = MappingProxyType(
        {"source_size": 4096, "output_size": 16384, "logo_size": 2048, "margin": 256, "bands": 16}
    )
    #: ``teardown`` drops images, logo and tables.
    _dropped = ("sources", "logo", "last_output", "_canvas", "_taps", "_row_index", "_columns",
                "_graphs", "_graph_canvas", "_graph_source")  # fmt: skip

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        presets = {"cpu": self.cpu_defaults, "gpu": self.gpu_defaults}
        self.config: ImageOptions = resolve_options(
            type(self).__name__, ImageOptions, presets, options
        )
        self.images_done = 0
        self.sources: torch.Tensor | None = None  # (n_sources, 3, S, S) uint8
        self.logo: torch.Tensor | None = None  # (4, L, L) uint8
        self.last_output: torch.Tensor | None = None  # (3, O, O) uint8, the latest image
        self._taps: tuple[Taps, Taps] | None = None  # (rows, columns), for "lanczos"
        self._row_index: torch.Tensor | None = None  # the row table's index, on the host
        self._columns: ColumnBlocks | None = None  # the column table in blocks (bands > 1)
        self._band = 0  # next band of the image in progress (bands > 1)
        self._canvas: torch.Tensor | None = None  # (3, O, O) uint8, the image in progress
        self._graphs: GraphedBands | None = None  # cuda_graphs on a GPU ([Note: graphed bands])
        self._graph_canvas: torch.Tensor | None = None  # (3, O, O) uint8, the graphs' canvas
        self._graph_source: torch.Tensor | None = None  # (3, S, S) uint8, the graphs' source

    def __repr__(self) -> str:
        return (
            f"<ImageTask {self.config.source_size}² → {self.config.output_size}² "
            f"{self.config.method} images_done={self.images_done} device={self.device!r}>"
        )

    def setup(self) -> None:
        """Generate the input images and the logo, and build the Lanczos tables, on the host."""
        cfg = self.config
        self.sources = torch.stack(
            [make_source_image(cfg.source_size, seed=cfg.seed + i) for i in range(cfg.n_sources)]
        )
        self.logo = make_logo(cfg.logo_size)
        if cfg.method == "lanczos":
            table = lanczos_taps(cfg.source_size, cfg.output_size)  # square: rows = columns
            self._taps = (table, table)
            self._row_index = table[0]  # stays on the host: a band's input rows, read there
            if cfg.bands > 1:
                self._columns = column_blocks(table, cfg.source_size)
        self.device = "cpu"

    def to_device(self, device: str) -> None:
        """Move images, logo and tables onto ``device`` ("cpu", "cuda", "cuda:1")."""
        sources, logo = self._require_setup()
        target = torch.device(device)
        self.sources, self.logo = sources.to(target), logo.to(target)
        if self._taps is not None:
            self._taps = (_taps_to(self._taps[0], target), _taps_to(self._taps[1], target))
        if self._columns is not None:
            self._columns = _taps_to(self._columns, target)
        self.last_output = self._canvas = None
        self._graphs = self._graph_canvas = self._graph_source = None  # on the old device
        self._band = 0  # a half-done image is redone on the new device
        self.device = str(target)

    def process(self, index: int) -> torch.Tensor:
        """Resize source ``index % n_sources`` and watermark it.

        Returns:
            (3, output_size, output_size) uint8 on the task's device.
        """
        sources, logo = self._require_setup()
        cfg = self.config
        size = (cfg.output_size, cfg.output_size)
        source = sources[index % cfg.n_sources]  # (3, S, S) uint8
        resized = resize(source, size, method=cfg.method, taps=self._taps)  # (3, O, O) float
        out = resized.round_().clamp_(0, 255).to(torch.uint8)  # (3, O, O)
        del resized
        top, left = watermark_origin(size, cfg.logo_size, cfg.position, cfg.margin)
        return alpha_blend(out, logo, top=top, left=left, alpha=cfg.alpha)

    @property
    def step_sizes(self) -> tuple[int, ...]:
        """The bands a step may take now: 1, 2, 4, ... up to ``step_bands`` and to the bands
        the image in progress has left ([Note: image bands])."""
        return doubling_sizes(min(self.config.step_bands, self.config.bands - self._band))

    def step(self, size: int = 1) -> float:
        """Process the next image (or, with ``bands > 1``, its next ``size`` bands); returns
        the share of an image made: 1, or ``size / bands`` ([Note: image bands]). A finished
        image is in ``last_output``.

        Raises:
            ValueError: a ``size`` that is not one of ``step_sizes``.
        """
        if size != 1 and size not in self.step_sizes:
            raise ValueError(f"size={size!r}; valid now: {self.step_sizes}")
        cfg = self.config
        if cfg.bands == 1:
            self.last_output = None  # free the previous output before making the next
            self.last_output = self.process(self.images_done)
            self.images_done += 1
            return 1.0
        if self._next_bands(size):
            self.images_done += 1
        return size / cfg.bands

    def _next_bands(self, count: int) -> bool:
        """Resize the next ``count`` bands of the current image as one band of their rows;
        True once the image's last band is done."""
        sources, logo = self._require_setup()
        cfg = self.config
        size = (cfg.output_size, cfg.output_size)
        source = sources[self.images_done % cfg.n_sources]  # (3, S, S) uint8
        if self._band == 0:
            self.last_output = None
            graphs = self._graphed()
            if graphs is None:
                self._canvas = torch.empty(3, *size, dtype=torch.uint8, device=sources.device)
            else:
                assert self._graph_source is not None
                self._graph_source.copy_(source)
                self._canvas = self._graph_canvas
        assert self._canvas is not None
        start = self._band * cfg.output_size // cfg.bands
        stop = (self._band + count) * cfg.output_size // cfg.bands
        if self._graphs is not None:
            self._graphs.run(count, start, stop)
        else:
            assert self._taps is not None  # bands > 1 implies lanczos (ImageOptions)
            assert self._row_index is not None
            rows = slice(start, stop)
            reads = band_source_rows(self._row_index, rows)
            band = resize_band(source, self._taps, rows, reads, columns=self._columns)
            self._canvas[:, start:stop] = band.round_().clamp_(0, 255).to(torch.uint8)
        self._band += count
        if self._band < cfg.bands:
            return False
        top, left = watermark_origin(size, cfg.logo_size, cfg.position, cfg.margin)
        self.last_output = alpha_blend(self._canvas, logo, top=top, left=left, alpha=cfg.alpha)
        self._canvas, self._band = None, 0
        return True

    def _graphed(self) -> GraphedBands | None:
        """At an image's first band: the band steps' graphs when they may be used
        (``cuda_graphs`` on a CUDA device), captured now if they are not yet, with the canvas
        and source buffer they write and read ([Note: graphed bands]); else None."""
        cfg = self.config
        if not (cfg.cuda_graphs and torch.device(self.device).type == "cuda"):
            return None
        if self._graphs is None:
            sources, _ = self._require_setup()
            assert self._taps is not None and self._columns is not None
            assert self._row_index is not None
            self._graph_source = torch.empty_like(sources[0])
            self._graph_canvas = torch.empty(
                3, cfg.output_size, cfg.output_size, dtype=torch.uint8, device=sources.device
            )
            windows = band_windows(
                self._row_index, cfg.output_size, cfg.bands, doubling_sizes(cfg.step_bands)
            )
            step = functools.partial(
                band_into, self._graph_canvas, self._graph_source, self._taps[0], self._columns
            )
            self._graphs = GraphedBands(step, windows, sources.device)
        return self._graphs

    def is_finished(self) -> bool:
        """True once ``max_images`` images are done (never when it is None)."""
        return self.config.max_images is not None and self.images_done >= self.config.max_images

    def state_dict(self) -> dict[str, Any]:
        """Whole images done and the progress they make: an image in progress is redone
        after a restore ([Note: image bands]; all else is regenerated by ``setup()``)."""
        partial = self._band / self.config.bands
        return {"progress": self.progress - partial, "images_done": self.images_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()``."""
        self.progress = float(state.get("progress", 0.0))
        self.images_done = int(state["images_done"])
        self._band, self._canvas = 0, None

    def _require_setup(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sources is None or self.logo is None:
            raise RuntimeError("ImageTask has no images yet; call setup() first")
        return self.sources, self.logo
