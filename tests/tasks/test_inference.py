"""The inference side task: KV-cached greedy decoding that matches a full forward, chunking,
exact resume after a checkpoint, memory that does not grow, and checked options."""

from __future__ import annotations

import pytest
import torch

from freeride_lab.tasks.inference import InferenceOptions, InferenceTask, kv_cache_bytes

SMALL = dict(
    vocab_size=64, d_model=32, layers=2, heads=4, batch_size=3, prompt_len=10, gen_len=6,
    prefill_chunk=4, decode_per_step=2,
)  # fmt: skip


def ready(**options: object) -> InferenceTask:
    task = InferenceTask(**{**SMALL, **options})
    task.setup()
    task.to_device("cpu")
    return task


def run_batch(task: InferenceTask) -> list[float]:
    done = [task.step()]
    while task.filled < task.config.max_len:
        done.append(task.step())
    return done


def test_cached_decoding_picks_the_tokens_a_full_forward_picks() -> None:
    task = ready()
    run_batch(task)
    tokens = task.tokens
    assert tokens is not None and task.model is not None
    c = task.config
    with torch.inference_mode():  # no cache: every position at once, causal
        logits = task.model(tokens[:, :-1], task.model.new_cache(c.batch_size, c.max_len), 0)
    greedy = logits.argmax(dim=-1)[:, c.prompt_len - 1 :]
    assert torch.equal(greedy, tokens[:, c.prompt_len :])


def test_steps_are_prefill_chunks_then_decode_chunks_counted_in_output_tokens() -> None:
    task = ready()
    done = run_batch(task)
    # prompt 10 in chunks of 4, 4, 2 positions: nothing generated until the last chunk makes
    # the first of 6 new tokens per sequence; then the other 5 two at a time (x 3 sequences)
    assert done == [0.0, 0.0, 3.0, 6.0, 6.0, 3.0]
    assert sum(done) == 3 * 6  # every generated token counted once
    assert task.batches_done == 1
    assert task.step() == 0.0 and task.batches_done == 1  # the next batch starts (prefill)


def test_a_restored_task_decodes_exactly_what_the_original_would() -> None:
    original = ready()
    for _ in range(4):  # mid-decode
        original.step()
    state = original.state_dict()
    clone = ready()
    clone.load_state_dict(state)
    for _ in range(3):
        assert clone.step() == original.step()
    assert torch.equal(clone.tokens, original.tokens)
    assert clone.batches_done == original.batches_done == 1


def test_moving_to_the_host_and_back_keeps_decoding_the_same_tokens() -> None:
    a, b = ready(), ready()
    for _ in range(4):
        a.step(), b.step()
    b.to_host()
    b.to_device("cpu")
    for _ in range(2):
        a.step(), b.step()
    assert torch.equal(a.tokens, b.tokens)


def test_batches_differ_and_the_cache_is_the_size_it_says() -> None:
    task = ready()
    run_batch(task)
    first = task.tokens.clone()
    run_batch(task)
    assert not torch.equal(first[:, :10], task.tokens[:, :10])  # new prompts
    assert task._cache is not None
    assert task._cache.numel() * task._cache.element_size() == kv_cache_bytes(task.config)


def test_presets_and_bad_options() -> None:
    gpu = InferenceOptions(**InferenceTask.gpu_defaults)
    assert kv_cache_bytes(gpu) == 1.5 * 2**30  # as the preset's comment says
    with pytest.raises(ValueError, match="multiple of heads"):
        InferenceTask(d_model=30, heads=4)
    with pytest.raises(ValueError, match="dtype"):
        InferenceTask(dtype="int8")
    with pytest.raises(ValueError, match="unknown"):
        InferenceTask(temperature=0.7)


def test_max_steps_finishes_the_task() -> None:
    task = ready(max_steps=2)
    task.step()
    assert not task.is_finished()
    task.step()
    assert task.is_finished()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_cached_decoding_matches_a_full_forward_and_bf16_runs() -> None:
    task = InferenceTask(**SMALL)
    task.setup()
    task.to_device("cuda")
    run_batch(task)
    c = task.config
    with torch.inference_mode():
        logits = task.model(task.tokens[:, :-1], task.model.new_cache(c.batch_size, c.max_len), 0)
    assert torch.equal(logits.argmax(dim=-1)[:, c.prompt_len - 1 :], task.tokens[:, c.prompt_len :])
    half = InferenceTask(**{**SMALL, "dtype": "bfloat16"})
    half.setup()
    half.to_device("cuda")
    assert sum(run_batch(half)) == 3 * c.gen_len  # output tokens, as on the CPU
    half.to_host()
    assert half.tokens.device.type == "cpu"
