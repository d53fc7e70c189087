"""ResNet-18/50 and VGG-19 side tasks: canonical networks, learning, exact resume, options."""

from __future__ import annotations

import pytest
import torch

from freeride_lab.tasks.nets import build_model, resnet18, resnet50, vgg19
from freeride_lab.tasks.vision import ResNet18Task, ResNet50Task, VGG19Task

TASKS = [ResNet18Task, ResNet50Task, VGG19Task]
TINY = {"batch_size": 4, "image_size": 32, "width_mult": 0.25, "n_batches": 1}


def _n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _ready(cls: type, **options: object) -> ResNet18Task:
    task = cls(**{**TINY, **options})
    task.setup()
    task.to_device("cpu")
    return task


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (resnet18, 11_689_512),
        (resnet50, 25_557_032),
        (vgg19, 143_667_240),
        (lambda: vgg19(batch_norm=True), 143_678_248),
    ],
    ids=["resnet18", "resnet50", "vgg19", "vgg19_bn"],
)
def test_own_networks_have_the_canonical_parameter_counts(build: object, expected: int) -> None:
    with torch.device("meta"):  # shapes only: no 575 MB of VGG weights
        model = build()  # type: ignore[operator]
    assert _n_params(model) == expected


@pytest.mark.parametrize("arch", ["resnet18", "resnet50", "vgg19"])
def test_own_networks_have_torchvisions_parameter_names_and_shapes(arch: str) -> None:
    try:
        import torchvision.models as tv
    except Exception:
        pytest.skip("torchvision does not import here")
    with torch.device("meta"):
        own = build_model(arch, impl="own").state_dict()
        theirs = getattr(tv, arch)(weights=None).state_dict()
    assert [(k, v.shape) for k, v in own.items()] == [(k, v.shape) for k, v in theirs.items()]


def test_networks_map_images_to_class_logits() -> None:
    model = build_model("resnet50", num_classes=7, width_mult=0.25)
    assert model(torch.randn(2, 3, 64, 64)).shape == (2, 7)


def test_own_implementation_is_the_default() -> None:
    assert ResNet18Task().config.impl == "own"


def test_torchvision_impl_without_torchvision_says_to_use_own() -> None:
    try:
        import torchvision.models  # noqa: F401
    except Exception:
        pass
    else:
        pytest.skip("torchvision imports here")
    with pytest.raises(ImportError, match="impl='own'"):
        build_model("resnet18", impl="torchvision")


def test_batch_norm_on_a_resnet_is_rejected() -> None:
    with pytest.raises(ValueError, match="vgg19 only"):
        build_model("resnet18", batch_norm=True)


@pytest.mark.parametrize("cls", TASKS, ids=lambda c: c.__name__)
def test_loss_falls_when_overfitting_one_batch(cls: type) -> None:
    task = _ready(cls)
    losses = []
    for _ in range(8):
        assert task.step() == 4.0
        losses.append(task.last_loss)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("cls", TASKS, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    ("micro_batches", "before", "after"),
    [(1, 2, 2), (2, 1, 3)],  # the second checkpoint falls between the slices of a batch
    ids=["whole-batches", "mid-batch"],
)
def test_state_dict_round_trip_resumes_with_the_same_losses(
    cls: type, micro_batches: int, before: int, after: int
) -> None:
    original = _ready(cls, n_batches=2, micro_batches=micro_batches)
    for _ in range(before):
        original.step()
    state = original.state_dict()
    expected = []
    for _ in range(after):
        original.step()
        expected.append(original.last_loss)

    resumed = _ready(cls, n_batches=2, micro_batches=micro_batches)
    resumed.load_state_dict(state)
    got = []
    for _ in range(after):
        resumed.step()
        got.append(resumed.last_loss)
    assert got == expected
    assert resumed.steps_done == original.steps_done == (before + after) // micro_batches
    assert original.model is not None and resumed.model is not None
    for a, b in zip(original.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_micro_batches_split_each_batch_and_step_the_optimizer_once_per_batch() -> None:
    task = _ready(ResNet18Task, batch_size=7, micro_batches=3)
    done = [task.step() for _ in range(3)]
    assert done == [3.0, 2.0, 2.0]  # the slices cover the batch once
    assert task.steps_done == 1 and task.micro_done == 0
    assert task.optimizer is not None
    assert {int(s["step"]) for s in task.optimizer.state.values()} == {1}
    task.step()
    assert (task.steps_done, task.micro_done) == (1, 1)


def test_one_slice_per_step_matches_a_whole_batch_without_batch_statistics() -> None:
    """VGG-19 without BatchNorm, dropout off: 4 slices accumulate the whole batch's gradient
    (to float rounding) before the one optimizer step."""
    whole = _ready(VGG19Task, batch_size=8)
    sliced = _ready(VGG19Task, batch_size=8, micro_batches=4)
    for task in (whole, sliced):
        assert task.model is not None
        for m in task.model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
    whole.step()
    for _ in range(4):
        sliced.step()
    assert whole.model is not None and sliced.model is not None
    for a, b in zip(whole.model.parameters(), sliced.model.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-7)


def _no_dropout(task: ResNet18Task) -> ResNet18Task:
    assert task.model is not None
    for m in task.model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return task


def test_fit_slices_offers_sizes_that_never_cross_the_batch_end() -> None:
    task = _ready(ResNet18Task, batch_size=8, micro_batches=4, fit_slices=True)
    seen = []
    for size in (1, 2, 1, 4, 2, 2):
        seen.append(task.step_sizes)
        assert task.step(size) == 2.0 * size  # two images a slice
    assert seen == [(1, 2, 4), (1, 2), (1,), (1, 2, 4), (1, 2, 4), (1, 2)]
    assert (task.steps_done, task.micro_done) == (3, 0)  # three batches, three Adam steps
    assert task.optimizer is not None
    assert {int(s["step"]) for s in task.optimizer.state.values()} == {3}


def test_a_size_the_task_does_not_offer_now_is_refused() -> None:
    task = _ready(ResNet18Task, batch_size=8, micro_batches=4, fit_slices=True)
    task.step(1)
    with pytest.raises(ValueError, match=r"size=4; valid now: \(1, 2\)"):
        task.step(4)
    plain = _ready(ResNet18Task, batch_size=8, micro_batches=4)
    assert plain.step_sizes == (1,)
    with pytest.raises(ValueError, match=r"size=2; valid now: \(1,\)"):
        plain.step(2)


@pytest.mark.parametrize(("sizes", "fixed"), [((4,), 1), ((2, 2), 2), ((1, 2, 1), 4)])
def test_steps_of_any_size_train_as_the_same_slices_would(
    sizes: tuple[int, ...], fixed: int
) -> None:
    """VGG-19 without BatchNorm, dropout off: a batch taken in steps of mixed sizes
    accumulates the gradient of the same batch taken in fixed slices (to float rounding)."""
    mixed = _no_dropout(_ready(VGG19Task, batch_size=8, micro_batches=4, fit_slices=True))
    plain = _no_dropout(_ready(VGG19Task, batch_size=8, micro_batches=fixed))
    for size in sizes:
        mixed.step(size)
    for _ in range(fixed):
        plain.step()
    assert mixed.steps_done == plain.steps_done == 1
    assert mixed.model is not None and plain.model is not None
    for a, b in zip(mixed.model.parameters(), plain.model.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-7)


def test_more_micro_batches_than_images_is_refused() -> None:
    with pytest.raises(ValueError, match=r"micro_batches=3 must be at most batch_size // 2 = 2"):
        ResNet18Task(**TINY, micro_batches=3)


def test_state_dict_is_a_snapshot_not_a_view() -> None:
    task = _ready(ResNet18Task)
    state = task.state_dict()
    before = state["model"]["fc.weight"].clone()
    task.step()
    assert torch.equal(state["model"]["fc.weight"], before)


def test_dropout_does_not_touch_the_global_rng() -> None:
    task = _ready(VGG19Task)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    task.step()
    assert torch.equal(torch.rand(3), expected)


def test_to_host_after_to_device_keeps_training() -> None:
    task = _ready(ResNet50Task)
    task.step()
    task.to_host()
    assert task.device == "cpu"
    task.to_device("cpu")
    task.step()
    assert all(p.device.type == "cpu" for p in task.model.parameters())
    assert task.steps_done == 2


def test_is_finished_after_max_steps() -> None:
    task = _ready(ResNet18Task, max_steps=2)
    task.step()
    assert not task.is_finished()
    task.step()
    assert task.is_finished()


def test_gpu_preset_has_freeride_sizes() -> None:
    cfg = VGG19Task(preset="gpu").config
    assert (cfg.batch_size, cfg.image_size, cfg.num_classes, cfg.width_mult) == (64, 224, 1000, 1)
    assert cfg.lr == 1e-3


def test_explicit_options_override_the_preset() -> None:
    assert ResNet18Task(preset="gpu", batch_size=16).config.batch_size == 16


def test_unknown_option_is_rejected_with_the_valid_names() -> None:
    with pytest.raises(ValueError, match=r"'batchsize'.*valid: preset, batch_size"):
        ResNet18Task(batchsize=8)


def test_bad_batch_size_names_the_value() -> None:
    with pytest.raises(ValueError, match=r"ResNet18Task: batch_size=0 must be >= 1"):
        ResNet18Task(batch_size=0)


def test_a_string_batch_size_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"batch_size='8' must be an int, not str"):
        ResNet18Task(batch_size="8")


def test_unknown_preset_lists_the_presets() -> None:
    with pytest.raises(ValueError, match=r"preset='tpu'.*'cpu', 'gpu'"):
        ResNet50Task(preset="tpu")


def test_batch_norm_option_exists_only_for_vgg() -> None:
    assert VGG19Task(batch_norm=True).config.batch_norm is True  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="'batch_norm'"):
        ResNet18Task(batch_norm=True)


@pytest.mark.gpu
@pytest.mark.parametrize("cls", TASKS, ids=lambda c: c.__name__)
def test_tasks_train_and_resume_on_cuda(cls: type) -> None:
    task = _ready(cls, n_batches=2)
    task.to_device("cuda")
    task.step()
    state = task.state_dict()
    task.step()
    expected = task.last_loss
    task.to_host()
    assert next(task.model.parameters()).device.type == "cpu"
    resumed = _ready(cls, n_batches=2)
    resumed.to_device("cuda")
    resumed.load_state_dict(state)
    resumed.step()
    assert resumed.last_loss == pytest.approx(expected, rel=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("cls", [ResNet18Task, VGG19Task], ids=lambda c: c.__name__)
def test_graphed_steps_of_every_size_match_eager_ones_on_cuda(cls: type) -> None:
    """With ``fit_slices`` and CUDA graphs, every size is captured once the graphs are made
    (no capture in a later bubble), and a batch taken in mixed sizes ends where eager steps of
    the same sizes end: the last step's loss, after four Adam steps, for VGG-19 (no
    BatchNorm); ResNet-18's BatchNorm over two-image slices amplifies the kernels' last bits
    too far for a comparison, so it only has to train."""
    options = {"batch_size": 8, "micro_batches": 4, "fit_slices": True, "n_batches": 2}
    graphed = _no_dropout(_ready(cls, cuda_graphs=True, **options))
    eager = _no_dropout(_ready(cls, **options))
    for task in (graphed, eager):
        task.to_device("cuda")
        for size in (4, 4, 1, 2, 1, 2, 2):  # one eager batch, then graphs, then mixed sizes
            task.step(size)
    assert graphed._graphs is not None
    assert graphed._graphs.captured == 5  # (2, 4, 8 images) x (last slice or not), less 8/not
    assert graphed.steps_done == eager.steps_done == 4
    assert graphed.warmup_steps == 2  # two whole batches, the largest steps
    if cls is VGG19Task:
        assert graphed.last_loss == pytest.approx(eager.last_loss, rel=1e-2)
    else:
        assert graphed.last_loss is not None and 0 < graphed.last_loss < 100
