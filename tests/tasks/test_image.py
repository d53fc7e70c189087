"""Image side task: Lanczos/bicubic resizing, alpha-blended watermark, task plumbing."""

from __future__ import annotations

import pytest
import torch

from freeride_lab.tasks.image import (
    METHODS,
    ImageTask,
    alpha_blend,
    band_source_rows,
    lanczos_taps,
    make_logo,
    make_source_image,
    resize,
    resize_band,
    watermark_origin,
)

SMALL = {"source_size": 48, "output_size": 96, "logo_size": 24, "margin": 4, "n_sources": 2}


def _ready(**options: object) -> ImageTask:
    task = ImageTask(**{**SMALL, **options})
    task.setup()
    task.to_device("cpu")
    return task


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("size", [(100, 70), (13, 17)], ids=["up", "down"])
def test_resizing_a_constant_image_keeps_it_constant(method: str, size: tuple[int, int]) -> None:
    image = torch.full((3, 40, 40), 77.0)
    out = resize(image, size, method=method)
    assert out.shape == (3, *size)
    assert torch.equal(out.round().to(torch.uint8), torch.full((3, *size), 77, dtype=torch.uint8))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("out_w", [160, 40], ids=["up", "down"])
def test_resizing_a_ramp_samples_the_analytic_ramp(method: str, out_w: int) -> None:
    in_w = 64
    ramp = torch.arange(in_w, dtype=torch.float32).expand(3, 32, in_w)  # value = column index
    out = resize(ramp, (32, out_w), method=method)
    scale = in_w / out_w
    centre = (torch.arange(out_w) + 0.5) * scale - 0.5  # input column each output samples
    margin = 3 * max(scale, 1.0) + 1  # the kernel must not reach an edge
    inner = (centre > margin) & (centre < in_w - 1 - margin)
    assert inner.sum() > out_w // 2
    torch.testing.assert_close(out[:, :, inner], centre[inner].expand(3, 32, -1), atol=0.05, rtol=0)


def test_lanczos_weights_sum_to_one_and_indices_stay_inside() -> None:
    for in_size, out_size in [(10, 37), (37, 10), (16, 16)]:
        index, weight = lanczos_taps(in_size, out_size)
        torch.testing.assert_close(weight.sum(dim=1), torch.ones(out_size))
        assert index.min() >= 0 and index.max() < in_size


def test_lanczos_at_the_same_size_is_the_identity() -> None:
    image = make_source_image(32, seed=1).float()
    torch.testing.assert_close(resize(image, (32, 32)), image, atol=1e-3, rtol=0)


def test_alpha_zero_leaves_the_image_unchanged() -> None:
    task = _ready(alpha=0.0)
    expected = resize(task.sources[0], (96, 96)).round().clamp(0, 255).to(torch.uint8)
    assert torch.equal(task.process(0), expected)


def test_alpha_one_puts_the_logo_where_it_is_opaque() -> None:
    image = make_source_image(64, seed=2)
    before = image.clone()
    logo = make_logo(20)
    alpha_blend(image, logo, top=10, left=30, alpha=1.0)
    region = image[:, 10:30, 30:50]
    opaque = logo[3] == 255
    assert opaque.sum() > 200
    assert torch.equal(region[:, opaque], logo[:3][:, opaque])
    assert torch.equal(region[:, logo[3] == 0], before[:, 10:30, 30:50][:, logo[3] == 0])
    outside = torch.ones(64, 64, dtype=torch.bool)
    outside[10:30, 30:50] = False
    assert torch.equal(image[:, outside], before[:, outside])


def test_an_opaque_logo_at_alpha_one_equals_the_logo_exactly() -> None:
    image = torch.zeros(3, 16, 16, dtype=torch.uint8)
    logo = torch.randint(0, 256, (4, 8, 8), dtype=torch.uint8)
    logo[3] = 255
    alpha_blend(image, logo, top=4, left=4, alpha=1.0)
    assert torch.equal(image[:, 4:12, 4:12], logo[:3])


def test_half_alpha_lands_halfway() -> None:
    image = torch.full((3, 4, 4), 100, dtype=torch.uint8)
    logo = torch.full((4, 2, 2), 200, dtype=torch.uint8)
    logo[3] = 255
    alpha_blend(image, logo, top=0, left=0, alpha=0.5)
    assert image[:, :2, :2].unique().tolist() == [150]


def test_a_logo_outside_the_image_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"top=10, left=10.*move or shrink"):
        alpha_blend(torch.zeros(3, 16, 16, dtype=torch.uint8), make_logo(8), top=10, left=10)


def test_watermark_positions_respect_the_margin() -> None:
    assert watermark_origin((100, 200), 20, "bottom-right", 5) == (75, 175)
    assert watermark_origin((100, 200), 20, "top-left", 5) == (5, 5)
    assert watermark_origin((100, 200), 20, "center", 5) == (40, 90)


@pytest.mark.parametrize("method", METHODS)
def test_step_makes_one_watermarked_image_of_the_output_size(method: str) -> None:
    task = _ready(method=method)  # alpha 0.5, logo 24 px at 4 px from the bottom-right
    assert task.step() == 1.0
    out = task.last_output
    assert out is not None and out.shape == (3, 96, 96) and out.dtype == torch.uint8
    plain = resize(task.sources[0], (96, 96), method=method).round().clamp(0, 255)
    logo_centre = task.logo[:3, 12, 12].float()  # opaque
    expected = (plain[:, 80, 80] + (logo_centre - plain[:, 80, 80]) * 0.5).round()
    assert torch.equal(out[:, 80, 80].float(), expected)
    assert torch.equal(out[:, :60, :60].float(), plain[:, :60, :60])  # away from the logo


def test_sources_are_deterministic_uint8_images() -> None:
    a, b = make_source_image(64, seed=5), make_source_image(64, seed=5)
    assert a.dtype == torch.uint8 and a.shape == (3, 64, 64) and torch.equal(a, b)
    assert not torch.equal(a, make_source_image(64, seed=6))


def test_state_dict_round_trip_continues_with_the_next_image() -> None:
    original = _ready()
    original.step()
    resumed = _ready()
    resumed.load_state_dict(original.state_dict())
    original.step()
    resumed.step()
    assert torch.equal(resumed.last_output, original.last_output)
    assert resumed.images_done == 2


def test_is_finished_after_max_images() -> None:
    task = _ready(max_images=1)
    assert not task.is_finished()
    task.step()
    assert task.is_finished()


def test_to_host_after_to_device_keeps_processing() -> None:
    task = _ready()
    task.step()
    task.to_host()
    task.to_device("cpu")
    task.step()
    assert task.images_done == 2 and task.device == "cpu"


def test_a_logo_larger_than_the_output_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"ImageTask: logo_size=200 .* does not fit"):
        ImageTask(output_size=128, logo_size=200)


def test_gpu_preset_makes_freeride_sized_outputs() -> None:
    assert ImageTask(preset="gpu").config.output_size == 16384


@pytest.mark.gpu
@pytest.mark.parametrize("method", METHODS)
def test_cuda_output_matches_cpu_within_one_level(method: str) -> None:
    cpu = _ready(method=method).process(1)
    task = _ready(method=method)
    task.to_device("cuda")
    gpu = task.process(1).cpu()
    assert (gpu.int() - cpu.int()).abs().max() <= 1


def test_an_image_in_bands_equals_the_image_in_one_step() -> None:
    whole, banded = _ready(), _ready(bands=5)
    assert whole.step() == 1.0
    done = [banded.step() for _ in range(5)]
    assert done == [0.2] * 5  # each band's share of the image, as it is made
    assert banded.images_done == 1 and banded.last_output is not None
    diff = (whole.last_output.int() - banded.last_output.int()).abs()
    assert diff.max() <= 1  # the two orders of the separable passes round differently
    assert diff.float().mean() < 0.01


def test_a_restore_mid_image_redoes_the_image_from_its_first_band() -> None:
    task = _ready(bands=4)
    task.progress += task.step() + task.step()  # as the task's host adds them
    state = task.state_dict()
    assert state["progress"] == 0.0  # half an image: redone, so not yet counted
    again = _ready(bands=4)
    again.load_state_dict(state)
    for _ in range(4):
        again.progress += again.step()
    assert again.images_done == 1 and again.progress == 1.0 and again.last_output is not None


def test_bands_need_lanczos_and_at_least_one_row_each() -> None:
    with pytest.raises(ValueError, match="needs method='lanczos'"):
        ImageTask(bands=2, method="bicubic")
    with pytest.raises(ValueError, match="a band needs at least one row"):
        ImageTask(output_size=16, logo_size=4, margin=1, bands=17)


def test_steps_of_several_bands_make_the_image_single_bands_make() -> None:
    single, sized = _ready(bands=8), _ready(bands=8, step_bands=4)
    offered, done = [], []
    for size in (4, 2, 1, 1, 2, 4, 2):
        offered.append(sized.step_sizes)
        done.append(sized.step(size))
    # never past the image's end: 8 bands, then the next image's 8
    assert offered == [(1, 2, 4), (1, 2, 4), (1, 2), (1,), (1, 2, 4), (1, 2, 4), (1, 2)]
    assert done == [0.5, 0.25, 0.125, 0.125, 0.25, 0.5, 0.25]  # an image's share each
    for _ in range(16):
        single.step()
    assert sized.images_done == single.images_done == 2
    assert torch.equal(sized.last_output, single.last_output)


def test_a_band_count_the_task_does_not_offer_now_is_refused() -> None:
    task = _ready(bands=8, step_bands=4)
    task.step(4), task.step(2)
    with pytest.raises(ValueError, match=r"size=4; valid now: \(1, 2\)"):
        task.step(4)
    assert _ready(bands=8).step_sizes == (1,)  # step_bands 1: one band a step, as before
    with pytest.raises(ValueError, match=r"size=2; valid now: \(1,\)"):
        _ready(bands=8).step(2)
    with pytest.raises(ValueError, match="step_bands=9 > bands=8"):
        ImageTask(**SMALL, bands=8, step_bands=9)


@pytest.mark.parametrize("rows", [slice(0, 12), slice(40, 56), slice(84, 96)])
def test_a_band_reads_only_its_source_rows_and_makes_the_whole_resizes_rows(rows: slice) -> None:
    """A band is resized from the input rows it needs, all channels at once, to the values
    a channel-by-channel resize, rows first, gives those rows (bit for bit)."""
    from freeride_lab.tasks.image import _resample

    source = make_source_image(48, seed=3)  # (3, 48, 48) uint8
    taps = (lanczos_taps(48, 96), lanczos_taps(48, 96))
    first, stop = band_source_rows(taps[0][0], rows)
    assert 0 <= first < stop <= 48 and stop - first < 48  # not the whole image
    damaged = source.clone()
    damaged[:, :first] = 255 - damaged[:, :first]  # rows outside the band's reach
    damaged[:, stop:] = 0
    band = resize_band(damaged, taps, rows, (first, stop))  # the columns tap by tap
    (index, weight), cols = taps
    by_channel = torch.stack(  # rows first, one channel at a time over the whole image
        [_resample(_resample(source[c].float(), (index[rows], weight[rows]), dim=0), cols, dim=1)
         for c in range(3)]
    )  # fmt: skip
    assert torch.equal(band, by_channel)
    whole = resize(source, (96, 96), taps=taps)
    assert torch.allclose(band, whole[:, rows], atol=1e-3)
    assert torch.equal(resize_band(source, taps, rows), band)  # bounds read off the table
