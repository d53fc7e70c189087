"""Where bench results go: one file per GPU model and date."""

from __future__ import annotations

from pathlib import Path

import pytest

from freeride_lab.lab import bench_results


@pytest.mark.parametrize(
    ("device", "name", "stem"),
    [
        ("cuda", "NVIDIA H200", "h200"),
        ("cuda", "NVIDIA H100 80GB HBM3", "h100"),
        ("cuda", "", "gpu"),
        ("cpu", "NVIDIA H200", "cpu"),
    ],
)
def test_results_files_are_named_after_the_gpu_that_made_them(
    device: str, name: str, stem: str
) -> None:
    out = bench_results.default_out(device, name)
    assert out.parent == Path("benchmarks") / "results"
    assert out.name.startswith(f"{stem}-") and out.suffix == ".json"
