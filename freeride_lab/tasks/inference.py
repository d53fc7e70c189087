"""Batch inference as a side task: a decoder-only language model prefilling and decoding.

Offline batch inference is what most fleets would put into pipeline bubbles. One ``step()``
does one bubble-sized chunk of a batch of requests and returns the tokens it generated:

- while the batch's prompts are not all read, a **prefill chunk**: the next ``prefill_chunk``
  prompt positions of every sequence, written to the KV cache in one forward;
- then **decode**: ``decode_per_step`` greedy tokens for every sequence, one position each.

When every sequence has ``gen_len`` new tokens the batch is done and the next step starts a new
one (prompts drawn from the task's seeded stream). The prefill's last position yields the first
new token, and the newest token is never fed back, so a sequence passes ``max_len - 1``
positions through the model::

    >>> task = InferenceTask(d_model=32, layers=1, heads=2, batch_size=2, prompt_len=8,
    ...                      gen_len=4, prefill_chunk=8, decode_per_step=2)
    >>> task.setup(); task.to_device("cpu")
    >>> [task.step() for _ in range(4)]    # prefill (+ first token), 2 tokens, 1, next prefill
    [2.0, 4.0, 2.0, 2.0]
    >>> task.batches_done
    1

The unit is output tokens, the generated ones (what a fleet counts: prompt positions are the
work's cost, not its product). A prompt position costs far less than a generated one (on an
H200 a 2,048-position prefill chunk takes 8 ms, 64 generated tokens 18 ms), so a unit that
counted both would measure a different speed for every mix of prefill and decode steps. The
KV cache is
allocated once per batch at its full size, ``kv_cache_bytes(options)``, so the task's memory
does not grow while it runs: size the batch to fit the task's memory cap.

[Note: resuming a batch]
The model never changes (its weights come from ``seed``) and decoding is greedy, so a batch is
fully described by its token ids so far. ``state_dict()`` keeps those ids, not the KV cache;
``load_state_dict()`` rebuilds the cache with one prefill over them (not counted as progress:
that work was counted when it was first done) and decoding goes on with the same tokens the
original would have produced.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from freeride_lab.tasks.device import HostReturningTask
from freeride_lab.tasks.options import check_choice, check_int, resolve_options

__all__ = ["InferenceOptions", "InferenceTask", "TinyLM", "kv_cache_bytes"]

DTYPES: Mapping[str, torch.dtype] = MappingProxyType(
    {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
)


@dataclass(frozen=True, kw_only=True)
class InferenceOptions:
    """Sizes of the inference side task; the defaults are the "cpu" preset's."""

    vocab_size: int = 512
    d_model: int = 256
    layers: int = 4
    heads: int = 4
    batch_size: int = 8  # sequences decoded together
    prompt_len: int = 128  # prompt tokens per sequence
    gen_len: int = 128  # new tokens per sequence
    prefill_chunk: int = 128  # prompt positions per prefill step
    decode_per_step: int = 16  # new tokens per sequence per decode step
    dtype: str = "float32"
    seed: int = 0
    max_steps: int | None = None  # is_finished() after this many steps; None: never

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "layers", "heads", "batch_size", "prompt_len",
                     "gen_len", "prefill_chunk", "decode_per_step"):  # fmt: skip
            check_int(name, getattr(self, name))
        check_int("seed", self.seed, minimum=0)
        check_int("max_steps", self.max_steps, optional=True)
        check_choice("dtype", self.dtype, tuple(DTYPES))
        if self.d_model % self.heads:
            raise ValueError(
                f"d_model={self.d_model} must be a multiple of heads={self.heads} "
                "(each head gets d_model / heads dimensions)"
            )

    @property
    def max_len(self) -> int:
        """Positions per sequence: prompt plus generated tokens."""
        return self.prompt_len + self.gen_len


def kv_cache_bytes(options: InferenceOptions) -> int:
    """Bytes of the KV cache of one batch: layers x (K, V) x batch x positions x d_model."""
    element = torch.tensor([], dtype=DTYPES[options.dtype]).element_size()
    return 2 * options.layers * options.batch_size * options.max_len * options.d_model * element


#: Attention kernels a step may use. Not cuDNN's: it builds an execution plan for every new key
#: length, and a decode step meets a new one with every token: 4 ms of host time per layer
#: and step, measured on an H200, against 25 µs of GPU time.
_ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


class _Block(nn.Module):
    """Pre-norm transformer block whose attention reads and extends a KV cache."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor, cache: torch.Tensor, start: int) -> torch.Tensor:
        """``x`` (B, T, D) at positions ``start .. start+T``; ``cache`` (2, B, H, L, D/H)."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        cache[0, :, :, start : start + t] = k
        cache[1, :, :, start : start + t] = v
        keys, values = cache[0, :, :, : start + t], cache[1, :, :, : start + t]
        # query i (position start+i) sees keys 0 .. start+i
        mask = torch.ones(t, start + t, dtype=torch.bool, device=x.device).tril(diagonal=start)
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        x = x + self.out(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    """A decoder-only language model with learned positions, read through a KV cache."""

    def __init__(self, vocab_size: int, d_model: int, layers: int, heads: int, max_len: int):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(_Block(d_model, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def new_cache(self, batch: int, max_len: int) -> torch.Tensor:
        """An empty cache: (layers, 2, batch, heads, max_len, head_dim) on the model's device."""
        w = self.head.weight
        d = w.shape[1]
        shape = (len(self.blocks), 2, batch, self.heads, max_len, d // self.heads)
        return torch.zeros(shape, dtype=w.dtype, device=w.device)

    def forward(self, tokens: torch.Tensor, cache: torch.Tensor, start: int) -> torch.Tensor:
        """Logits (B, T, vocab) of ``tokens`` (B, T) at positions ``start ..``, filling
        ``cache`` for those positions."""
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.pos(positions)
        with sdpa_kernel(_ATTENTION_BACKENDS):
            for i, block in enumerate(self.blocks):
                x = block(x, cache[i], start)
        return self.head(self.norm(x))


class InferenceTask(HostReturningTask):
    """Greedy batch inference with a KV cache; one step = one prefill chunk or a few decode
    tokens per sequence (unit: tokens)."""

    unit: ClassVar[str] = "output tokens"
    state_dict_is_copy: ClassVar[bool] = True  # counters and a host copy of the tokens
    cpu_defaults: ClassVar[Mapping[str, Any]] = MappingProxyType({})
    #: preset="gpu": a 0.9 B-parameter model in bf16 (1.9 GB), 16 sequences of 512 + 256
    #: tokens (KV cache 1.5 GiB).
    gpu_defaults: ClassVar[Mapping[str, Any]] = MappingProxyType(
        {"vocab_size": 32000, "d_model": 2048, "layers": 16, "heads": 16, "batch_size": 16,
         "prompt_len": 512, "gen_len": 256, "prefill_chunk": 128, "decode_per_step": 4,
         "dtype": "bfloat16"}
    )  # fmt: skip
    #: ``teardown`` drops the model, the batch and the cache.
    _dropped = ("model", "tokens", "_cache")

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        presets = {"cpu": self.cpu_defaults, "gpu": self.gpu_defaults}
        self.config: InferenceOptions = resolve_options(
            type(self).__name__, InferenceOptions, presets, options
        )
        self.model: TinyLM | None = None
        self.steps_done = 0
        self.batches_done = 0
        self.tokens: torch.Tensor | None = None  # (B, max_len) int64: the batch's ids so far
        self.filled = 0  # positions of the batch already in the cache
        self._cache: torch.Tensor | None = None
        self._cached = 0  # positions the cache holds (< filled after a restore)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"<InferenceTask d_model={c.d_model} layers={c.layers} batch_size={c.batch_size} "
            f"batches_done={self.batches_done} filled={self.filled}/{c.max_len} "
            f"device={self.device!r}>"
        )

    def setup(self) -> None:
        """Build the model (weights from ``seed``) in host memory."""
        c = self.config
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(c.seed)
            model = TinyLM(c.vocab_size, c.d_model, c.layers, c.heads, c.max_len)
        self.model = model.to(DTYPES[c.dtype]).eval()
        self.device = "cpu"

    def to_device(self, device: str) -> None:
        """Move the model and the batch onto ``device``; the cache is rebuilt there."""
        model = self._require_model()
        target = torch.device(device)
        model.to(target)
        if self.tokens is not None:
            self.tokens = self.tokens.to(target)
        self._cache, self._cached = None, 0
        self.device = str(target)

    @torch.inference_mode()
    def step(self) -> float:
        """One prefill chunk or ``decode_per_step`` tokens per sequence; returns the tokens
        generated (a prefill chunk: none, but the prompt's last one makes the first)."""
        c = self.config
        if self.tokens is None or self.filled >= c.max_len:
            self._new_batch()
        model, tokens = self._require_model(), self.tokens
        assert tokens is not None  # set by _new_batch
        cache = self._ensure_cache(model)
        done = 0
        if self.filled < c.prompt_len:  # prefill the next chunk of every prompt
            start, end = self.filled, min(self.filled + c.prefill_chunk, c.prompt_len)
            logits = model(tokens[:, start:end], cache, start)
            self.filled = self._cached = end
            if end == c.prompt_len:  # the prompt's last logits give the first new token
                self._append(logits[:, -1])
                done = c.batch_size
        else:
            for _ in range(c.decode_per_step):
                if self.filled >= c.max_len:
                    break
                last = tokens[:, self.filled - 1 : self.filled]
                logits = model(last, cache, self.filled - 1)
                self._cached = self.filled
                self._append(logits[:, -1])
                done += c.batch_size
        self.steps_done += 1
        if self.filled >= c.max_len:
            self.batches_done += 1
        return float(done)

    def is_finished(self) -> bool:
        """True once ``max_steps`` steps are done (never when it is None)."""
        return self.config.max_steps is not None and self.steps_done >= self.config.max_steps

    def state_dict(self) -> dict[str, Any]:
        """Counters and the batch's token ids (see [Note: resuming a batch])."""
        return {
            "progress": self.progress,
            "steps_done": self.steps_done,
            "batches_done": self.batches_done,
            "filled": self.filled,
            "tokens": None if self.tokens is None else self.tokens.to("cpu", copy=True),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` (after ``setup()``, on any device)."""
        self._require_model()
        self.progress = float(state.get("progress", 0.0))
        self.steps_done = int(state["steps_done"])
        self.batches_done = int(state["batches_done"])
        self.filled = int(state["filled"])
        tokens = state["tokens"]
        self.tokens = None if tokens is None else tokens.to(self.device)
        self._cache, self._cached = None, 0

    # -- internals -------------------------------------------------------------------------

    def _new_batch(self) -> None:
        """Prompts of the next batch, drawn from the task's seed and the batch's number."""
        c = self.config
        g = torch.Generator().manual_seed(c.seed * 1_000_003 + self.batches_done + 1)
        tokens = torch.zeros(c.batch_size, c.max_len, dtype=torch.long)
        tokens[:, : c.prompt_len] = torch.randint(c.vocab_size, (c.batch_size, c.prompt_len),
                                                   generator=g)  # fmt: skip
        self.tokens = tokens.to(self.device)
        self.filled = 0
        self._cache, self._cached = None, 0

    def _ensure_cache(self, model: TinyLM) -> torch.Tensor:
        """The batch's cache, rebuilt over the known positions after a restore or a move."""
        c = self.config
        if self._cache is None:
            self._cache = model.new_cache(c.batch_size, c.max_len)
            self._cached = 0
        if self._cached < self._known():
            assert self.tokens is not None
            known = self._known()
            model(self.tokens[:, self._cached : known], self._cache, self._cached)
            self._cached = known
        return self._cache

    def _known(self) -> int:
        """Positions whose keys and values belong in the cache: the prompt read so far, and
        every generated token but the newest (it is the next decode step's input)."""
        prompt = self.config.prompt_len
        return self.filled if self.filled <= prompt else self.filled - 1

    def _append(self, logits: torch.Tensor) -> None:
        assert self.tokens is not None
        self.tokens[:, self.filled] = logits.argmax(dim=-1)
        self.filled += 1

    def _require_model(self) -> TinyLM:
        if self.model is None:
            raise RuntimeError("InferenceTask has no model yet; call setup() first")
        return self.model
