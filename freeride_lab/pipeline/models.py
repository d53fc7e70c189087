"""A tiny byte-level GPT (nanoGPT style), split into pipeline stage chunks.

The model is token embedding + position embedding → ``layers`` pre-LN transformer blocks →
final LayerNorm → LM head. ``build_stage_chunks`` cuts it into ``n_chunks`` modules (S·v for
S ranks of v chunks each) that each map one tensor to one tensor, as
``torch.distributed.pipelining`` wants::

    chunk 0:      tokens (B, T) int64  → hidden (B, T, D)      embeddings + its blocks
    chunk k:      hidden (B, T, D)     → hidden (B, T, D)      its blocks
    chunk last:   hidden (B, T, D)     → logits (B, T, V)      its blocks + LN + head

Initialisation is deterministic: every component draws from its own generator seeded from
``(seed, component index)``, so any rank that builds any subset of chunks gets exactly the
weights the full model would have.

    >>> chunks = build_stage_chunks(GPTConfig(layers=4, d_model=32, heads=4), 2)
    >>> [len(c.blocks) for c in chunks]
    [2, 2]
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Block", "GPTConfig", "StageChunk", "build_stage_chunks", "split_layers"]


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """Size of the GPT. ``vocab_size`` 256 is one token per byte; ``seq_len`` is the context T."""

    vocab_size: int = 256
    seq_len: int = 64
    layers: int = 8
    d_model: int = 64
    heads: int = 4
    dropout: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "layers", "d_model", "heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be an integer >= 1")
        if self.d_model % self.heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by heads={self.heads}; "
                "pick d_model as a multiple of heads"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1)")


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through ``F.scaled_dot_product_attention``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=2)  # 3 x (B, T, D)
        q = q.view(B, T, self.heads, D // self.heads).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.heads, D // self.heads).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.heads, D // self.heads).transpose(1, 2)  # (B, nh, T, hs)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, D)  # (B, T, D)
        out: torch.Tensor = self.proj(y)  # (B, T, D)
        return out


class MLP(nn.Module):
    """Position-wise feed-forward, 4x wide, GELU."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.d_model, 4 * config.d_model)
        self.down = nn.Linear(4 * config.d_model, config.d_model)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.drop(self.down(F.gelu(self.up(x))))  # (B, T, 4D) → (B, T, D)
        return out


class Block(nn.Module):
    """Pre-LN transformer block: ``x + attn(ln(x))`` then ``x + mlp(ln(x))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))  # (B, T, D)
        out: torch.Tensor = x + self.mlp(self.ln_2(x))  # (B, T, D)
        return out


class Embedding(nn.Module):
    """Token + learned position embedding: tokens (B, T) int64 → (B, T, D)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.seq_len = config.seq_len
        self.tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.positions = nn.Embedding(config.seq_len, config.d_model)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        if self.seq_len < T:
            raise ValueError(f"sequence length {T} > seq_len={self.seq_len}; cut the input")
        pos = torch.arange(T, device=idx.device)  # (T,)
        out: torch.Tensor = self.drop(self.tokens(idx) + self.positions(pos))  # (B, T, D)
        return out


class Head(nn.Module):
    """Final LayerNorm + LM head: (B, T, D) → logits (B, T, V)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lm_head(self.ln_f(x))  # (B, T, V)
        return out


class StageChunk(nn.Module):
    """One pipeline stage chunk: optional embedding, a run of blocks, optional head."""

    def __init__(
        self,
        index: int,
        blocks: Iterable[Block],
        *,
        embedding: Embedding | None = None,
        head: Head | None = None,
    ) -> None:
        super().__init__()
        self.index = index
        self.embedding = embedding
        self.blocks = nn.ModuleList(blocks)
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)  # (B, T) int64 → (B, T, D)
        for block in self.blocks:
            x = block(x)  # (B, T, D)
        if self.head is not None:
            x = self.head(x)  # (B, T, D) → (B, T, V)
        return x

    def extra_repr(self) -> str:
        return f"index={self.index}"


def split_layers(layers: int, n_chunks: int) -> list[range]:
    """Block indices per chunk: even split, the remainder going to the earlier chunks."""
    if n_chunks < 1 or layers < n_chunks:
        raise ValueError(
            f"layers={layers} cannot be split over n_chunks={n_chunks}: every chunk needs at "
            "least one block; raise layers or lower stagesxchunks"
        )
    base, extra = divmod(layers, n_chunks)
    out: list[range] = []
    start = 0
    for i in range(n_chunks):
        size = base + (1 if i < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def build_stage_chunks(
    config: GPTConfig, n_chunks: int, *, only: Iterable[int] | None = None
) -> list[nn.Module]:
    """The GPT cut into ``n_chunks`` stage modules, deterministically initialised from
    ``config.seed``.

    Args:
        only: chunk indices to build (saves memory on a rank that holds a few); the others
            come back as ``nn.Identity`` placeholders so list positions stay global indices.

    Raises:
        ValueError: fewer layers than chunks, or an index in ``only`` out of range.
    """
    ranges = split_layers(config.layers, n_chunks)
    wanted = set(range(n_chunks)) if only is None else set(only)
    bad = sorted(i for i in wanted if not 0 <= i < n_chunks)
    if bad:
        raise ValueError(f"chunk indices {bad} out of range for n_chunks={n_chunks}")
    chunks: list[nn.Module] = []
    for i, blocks in enumerate(ranges):
        if i not in wanted:
            chunks.append(nn.Identity())
            continue
        embedding = None
        if i == 0:
            embedding = Embedding(config)
            _init(embedding, config, component=0)
        built = []
        for b in blocks:
            block = Block(config)
            _init(block, config, component=1 + b)
            built.append(block)
        head = None
        if i == n_chunks - 1:
            head = Head(config)
            _init(head, config, component=1 + config.layers)
        chunks.append(StageChunk(i, built, embedding=embedding, head=head))
    return chunks


def _init(module: nn.Module, config: GPTConfig, *, component: int) -> None:
    """nanoGPT's init (normal 0.02, residual projections scaled by 1/sqrt(2·layers)) drawn from
    a generator private to ``(seed, component)``."""
    g = torch.Generator().manual_seed(config.seed * 1_000_003 + component)
    residual_std = 0.02 / math.sqrt(2 * config.layers)
    for name, sub in module.named_modules():
        if isinstance(sub, nn.Linear):
            std = residual_std if name.endswith(("proj", "down")) else 0.02
            with torch.no_grad():
                sub.weight.normal_(0.0, std, generator=g)
                if sub.bias is not None:
                    sub.bias.zero_()
        elif isinstance(sub, nn.Embedding):
            with torch.no_grad():
                sub.weight.normal_(0.0, 0.02, generator=g)
        elif isinstance(sub, nn.LayerNorm):
            nn.init.ones_(sub.weight)
            nn.init.zeros_(sub.bias)
