"""Claims about the training data sources (real files, nothing downloaded)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from freeride_lab.pipeline.data import SyntheticBatches, TextBatches, load_text


def test_default_corpus_is_the_standard_librarys_python_source() -> None:
    text = load_text(max_bytes=100_000)
    assert len(text) == 100_000
    assert b"def " in text and b"import " in text


def test_text_batches_are_deterministic_in_the_seed() -> None:
    a = [next(TextBatches(seq_len=8, batch=3, seed=4, max_bytes=50_000)) for _ in range(2)]
    b = [next(TextBatches(seq_len=8, batch=3, seed=4, max_bytes=50_000)) for _ in range(2)]
    c = next(TextBatches(seq_len=8, batch=3, seed=5, max_bytes=50_000))
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0][0], c[0])


def test_targets_are_inputs_shifted_by_one_byte(tmp_path: Path) -> None:
    path = tmp_path / "abc.txt"
    path.write_bytes(bytes(range(200)))
    x, y = next(TextBatches(seq_len=10, batch=4, text_path=path, heldout_frac=0.05))
    assert x.dtype == y.dtype == torch.int64 and x.shape == (4, 10)
    assert torch.equal(y, x + 1)  # the file counts up byte by byte


def test_heldout_split_samples_only_the_tail(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(bytes([1]) * 900 + bytes([2]) * 100)
    x, _ = next(TextBatches(seq_len=5, batch=8, text_path=path, split="heldout"))
    assert set(x.flatten().tolist()) == {2}


def test_a_directory_text_path_reads_its_files_in_sorted_order(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_bytes(b"second")
    (tmp_path / "a.txt").write_bytes(b"first ")
    assert load_text(tmp_path) == b"first second"


def test_missing_text_path_names_the_path_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.txt.*does not exist"):
        load_text(tmp_path / "nope.txt")


def test_too_short_text_for_seq_len_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "short.txt"
    path.write_bytes(b"0123456789")
    with pytest.raises(ValueError, match="fewer than seq_len"):
        TextBatches(seq_len=32, batch=1, text_path=path)


def test_synthetic_batches_have_the_stage_tensor_shape() -> None:
    x, y = next(SyntheticBatches(seq_len=8, batch=2, d_model=16, seed=0))
    assert x.shape == y.shape == (2, 8, 16)
    assert not torch.any(y)
