"""Vision tasks' steps as CUDA graphs: the same training as eager steps, at the GPU's pace.

On the CPU the option changes nothing (there is nothing to capture); the GPU tests compare a
graphed task with an eager twin step by step, and check that moving and restoring a graphed
task drops its graphs and keeps training right.
"""

from __future__ import annotations

import pytest

from freeride_lab.tasks.vision import ResNet18Task, VGG19Task

TASKS = [ResNet18Task, VGG19Task]
TINY = {"batch_size": 8, "image_size": 32, "width_mult": 0.25, "n_batches": 2}


def _ready(cls: type, device: str, **options: object) -> ResNet18Task:
    task = cls(**{**TINY, **options})
    task.setup()
    task.to_device(device)
    return task


def _losses(task: ResNet18Task, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        task.step()
        loss = task.last_loss
        assert loss is not None
        out.append(loss)
    return out


def test_cuda_graphs_must_be_true_or_false() -> None:
    with pytest.raises(TypeError, match="cuda_graphs='yes' must be True or False"):
        ResNet18Task(cuda_graphs="yes")


def test_on_the_cpu_cuda_graphs_steps_eagerly_with_no_warm_up() -> None:
    graphed = _ready(ResNet18Task, "cpu", cuda_graphs=True, micro_batches=2)
    eager = _ready(ResNet18Task, "cpu", micro_batches=2)
    assert graphed.warmup_steps == 0
    assert _losses(graphed, 5) == _losses(eager, 5)


@pytest.mark.gpu
@pytest.mark.parametrize("micro_batches", [1, 2], ids=["whole-batches", "2-slices"])
@pytest.mark.parametrize("cls", TASKS, ids=lambda c: c.__name__)
def test_graphed_steps_train_as_the_eager_steps_do(cls: type, micro_batches: int) -> None:
    graphed = _ready(cls, "cuda", cuda_graphs=True, micro_batches=micro_batches)
    eager = _ready(cls, "cuda", micro_batches=micro_batches)
    steps = 4 * micro_batches  # one eager batch, then the captures, then replays
    assert graphed.warmup_steps == 2 * micro_batches
    # BatchNorm's graphed and eager kernels differ in the last bits, and three Adam steps
    # amplify that: ResNet-18's fourth loss moved by 1.2% on an H100
    rel = 1e-2 if cls is VGG19Task else 3e-2
    assert _losses(graphed, steps) == pytest.approx(_losses(eager, steps), rel=rel)
    assert graphed.steps_done == eager.steps_done == 4
    assert graphed._graphs is not None and graphed._graphs.captured == min(micro_batches, 2)


@pytest.mark.gpu
def test_a_graphed_task_resumes_from_its_state_dict_mid_batch() -> None:
    """VGG-19 draws dropout masks from the task's own stream inside the graph."""
    original = _ready(VGG19Task, "cuda", cuda_graphs=True, micro_batches=2)
    _losses(original, 5)  # graphed from the third step; the state falls between two slices
    state = original.state_dict()
    expected = _losses(original, 5)
    resumed = _ready(VGG19Task, "cuda", cuda_graphs=True, micro_batches=2)
    resumed.load_state_dict(state)
    assert _losses(resumed, 5) == pytest.approx(expected, rel=1e-2)


@pytest.mark.gpu
def test_moving_a_graphed_task_off_the_gpu_and_back_keeps_training() -> None:
    task = _ready(ResNet18Task, "cuda", cuda_graphs=True)
    _losses(task, 3)
    assert task._graphs is not None
    task.to_host()
    assert task._graphs is None
    _losses(task, 2)  # Adam's step counts are back on the host: eager CPU steps work
    task.to_device("cuda")
    _losses(task, 3)  # one eager batch, then graphs again
    assert task._graphs is not None and task.steps_done == 8
