"""Training data with nothing downloaded: byte-level text and synthetic tensors.

The default corpus is the Python standard library's own source: the ``*.py`` files directly in
``sysconfig.get_paths()["stdlib"]``, in sorted order, read until ``max_bytes``. It is real
English-and-code text, present on every machine that runs Python, and identical for all ranks
of one host. A ``text_path`` (a file, or a directory whose files are read in sorted order)
replaces it. Every byte is one token (vocabulary 256).

Ranks must agree on the text: the rank holding the first stage feeds the inputs and the rank
holding the last stage scores the targets of the *same* samples. On several hosts with
different Python versions, pass one shared ``text_path``.

    >>> batches = TextBatches(seq_len=16, batch=2, seed=0)
    >>> x, y = next(iter(batches))
    >>> x.shape, y.dtype
    (torch.Size([2, 16]), torch.int64)
"""

from __future__ import annotations

import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import torch

__all__ = ["SyntheticBatches", "TextBatches", "load_text"]

DEFAULT_MAX_BYTES = 4 << 20  # 4 MiB: ample for a tiny GPT, fast to read
Split = Literal["train", "heldout"]


def load_text(text_path: str | Path | None = None, *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The corpus bytes: ``text_path`` (file or directory) or the standard library's sources.

    Raises:
        FileNotFoundError: ``text_path`` does not exist.
        ValueError: the corpus is empty.
    """
    if max_bytes < 1:
        raise ValueError(f"max_bytes={max_bytes} must be >= 1")
    if text_path is None:
        root = Path(sysconfig.get_paths()["stdlib"])
        files = sorted(root.glob("*.py"))
        source = f"the standard library at {root}"
    else:
        root = Path(text_path).expanduser()
        if not root.exists():
            raise FileNotFoundError(
                f"text_path={str(text_path)!r} does not exist; give a text file or a directory "
                "of text files, or None for the standard library's sources"
            )
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        source = f"text_path={str(text_path)!r}"
    parts: list[bytes] = []
    size = 0
    for f in files:
        if size >= max_bytes:
            break
        data = f.read_bytes()[: max_bytes - size]
        parts.append(data)
        size += len(data)
    text = b"".join(parts)
    if not text:
        raise ValueError(f"no text found in {source}; point text_path at a non-empty text file")
    return text


class TextBatches:
    """Endless (inputs, targets) batches of random windows of the corpus, deterministic in
    ``seed``: each is int64 ``(batch, seq_len)`` and targets are inputs shifted by one byte.

    The last ``heldout_frac`` of the corpus is held out; ``split="heldout"`` samples from it.
    """

    def __init__(
        self,
        *,
        seq_len: int,
        batch: int,
        seed: int = 0,
        text_path: str | Path | None = None,
        split: Split = "train",
        heldout_frac: float = 0.1,
        max_bytes: int = DEFAULT_MAX_BYTES,
        text: bytes | None = None,
    ) -> None:
        if seq_len < 1 or batch < 1:
            raise ValueError(f"seq_len={seq_len} and batch={batch} must both be >= 1")
        if split not in ("train", "heldout"):
            raise ValueError(f"split={split!r}; valid: train, heldout")
        if not 0.0 < heldout_frac < 1.0:
            raise ValueError(f"heldout_frac={heldout_frac} must be in (0, 1)")
        raw = text if text is not None else load_text(text_path, max_bytes=max_bytes)
        tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.int64)  # (N,)
        cut = int(len(tokens) * (1.0 - heldout_frac))
        self.tokens = tokens[:cut] if split == "train" else tokens[cut:]
        if len(self.tokens) < seq_len + 1:
            raise ValueError(
                f"the {split} text has {len(self.tokens)} bytes, fewer than seq_len+1="
                f"{seq_len + 1}; give more text or a shorter seq_len"
            )
        self.seq_len = seq_len
        self.batch = batch
        self.seed = seed
        self.split = split
        self._generator = torch.Generator().manual_seed(seed)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        high = len(self.tokens) - self.seq_len  # last valid start + 1
        starts = torch.randint(0, high, (self.batch,), generator=self._generator)  # (B,)
        offsets = torch.arange(self.seq_len + 1)  # (T+1,)
        windows = self.tokens[starts[:, None] + offsets]  # (B, T+1)
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()  # (B, T), (B, T)

    def __repr__(self) -> str:
        return (
            f"TextBatches(split={self.split!r}, tokens={len(self.tokens)}, "
            f"seq_len={self.seq_len}, batch={self.batch}, seed={self.seed})"
        )


class SyntheticBatches:
    """Endless (inputs, targets) float batches ``(batch, seq_len, d_model)`` for sleep-timed
    stages: inputs are deterministic noise from ``seed``, targets are zeros."""

    def __init__(
        self,
        *,
        seq_len: int,
        batch: int,
        d_model: int,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if min(seq_len, batch, d_model) < 1:
            raise ValueError(
                f"seq_len={seq_len}, batch={batch}, d_model={d_model} must all be >= 1"
            )
        self.shape = (batch, seq_len, d_model)
        self.dtype = dtype
        self._generator = torch.Generator().manual_seed(seed)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(self.shape, generator=self._generator).to(self.dtype)  # (B, T, D)
        return x, torch.zeros(self.shape, dtype=self.dtype)  # (B, T, D), (B, T, D)
