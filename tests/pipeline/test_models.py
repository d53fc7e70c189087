"""Claims about the tiny GPT and its split into pipeline stage chunks (pure, no processes)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from freeride_lab.pipeline.models import GPTConfig, build_stage_chunks, split_layers

SMALL = GPTConfig(layers=5, d_model=32, heads=4, seq_len=16)


def test_blocks_split_evenly_with_the_remainder_on_earlier_chunks() -> None:
    assert [len(r) for r in split_layers(5, 3)] == [2, 2, 1]
    assert [list(r) for r in split_layers(4, 2)] == [[0, 1], [2, 3]]


def test_split_rejects_fewer_layers_than_chunks() -> None:
    with pytest.raises(ValueError, match="layers=2 cannot be split over n_chunks=3"):
        split_layers(2, 3)


def test_config_rejects_d_model_not_divisible_by_heads() -> None:
    with pytest.raises(ValueError, match="d_model=30 is not divisible by heads=4"):
        GPTConfig(d_model=30, heads=4)


def test_chunks_chain_tokens_to_logits_one_tensor_each() -> None:
    chunks = build_stage_chunks(SMALL, 3)
    x = torch.randint(0, 256, (2, 16))  # (B, T)
    shapes = []
    for chunk in chunks:
        x = chunk(x)
        shapes.append(tuple(x.shape))
    assert shapes == [(2, 16, 32), (2, 16, 32), (2, 16, 256)]


def test_only_first_chunk_embeds_and_only_last_has_the_head() -> None:
    chunks = build_stage_chunks(SMALL, 3)
    assert [c.embedding is not None for c in chunks] == [True, False, False]  # type: ignore[union-attr]
    assert [c.head is not None for c in chunks] == [False, False, True]  # type: ignore[union-attr]


def test_a_rank_building_some_chunks_gets_the_full_models_weights() -> None:
    full = build_stage_chunks(SMALL, 3)
    part = build_stage_chunks(SMALL, 3, only=[2])
    assert isinstance(part[0], torch.nn.Identity)
    for a, b in zip(full[2].state_dict().values(), part[2].state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_init_depends_on_the_seed() -> None:
    a = build_stage_chunks(SMALL, 1)[0].state_dict()
    b = build_stage_chunks(GPTConfig(layers=5, d_model=32, heads=4, seq_len=16, seed=1), 1)[0]
    assert not torch.equal(a["embedding.tokens.weight"], b.state_dict()["embedding.tokens.weight"])


def test_attention_is_causal() -> None:
    (model,) = build_stage_chunks(SMALL, 1)
    x = torch.randint(0, 256, (1, 16))
    y = x.clone()
    y[0, -1] = (x[0, -1] + 1) % 256  # change only the last token
    assert torch.allclose(model(x)[0, :-1], model(y)[0, :-1], atol=1e-6)


def test_initial_loss_is_near_uniform_over_bytes() -> None:
    (model,) = build_stage_chunks(SMALL, 1)
    x = torch.randint(0, 256, (4, 16))
    loss = F.cross_entropy(model(x).reshape(-1, 256), x.reshape(-1))
    assert abs(loss.item() - torch.log(torch.tensor(256.0)).item()) < 0.2
