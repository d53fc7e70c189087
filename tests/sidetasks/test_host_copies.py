"""``host_copies``: a task's state copied to host memory, nothing shared with the live state;
a GPU tensor's copy made into pinned memory, all of them queued before one wait."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pytest

from freeride_lab.sidetasks.api import host_copies

torch = pytest.importorskip("torch")


class Moments(NamedTuple):
    first: Any
    second: Any


def _state(device: str) -> dict[str, Any]:
    weights = torch.arange(12.0, device=device).reshape(3, 4)
    return {
        "step": 7,
        "weights": weights,
        "columns": weights.t(),  # not contiguous
        "moments": Moments(torch.ones(5, device=device), torch.zeros(5, device=device)),
        "history": [np.arange(3), (torch.tensor([1, 2], device=device), "tag")],
    }


def _assert_copied(copy: dict[str, Any], live: dict[str, Any]) -> None:
    assert copy["step"] == 7 and copy["history"][1][1] == "tag"
    assert isinstance(copy["moments"], Moments) and isinstance(copy["history"][1], tuple)
    pairs = [
        (copy["weights"], live["weights"]),
        (copy["columns"], live["columns"]),
        (copy["moments"].first, live["moments"].first),
        (copy["history"][1][0], live["history"][1][0]),
    ]
    for c, x in pairs:
        assert c.device.type == "cpu" and torch.equal(c, x.cpu())
    live["weights"].add_(100.0)  # a later step changes the live state only
    live["moments"].first.zero_()
    live["history"][0][0] = 99
    assert copy["weights"][0, 0].item() == 0.0 and copy["columns"][1, 0].item() == 1.0
    assert copy["moments"].first.sum().item() == 5.0 and copy["history"][0][0] == 0


def test_a_copy_of_a_host_state_shares_nothing_with_it() -> None:
    live = _state("cpu")
    _assert_copied(host_copies(live), live)


@pytest.mark.gpu
def test_a_gpu_state_is_copied_into_pinned_memory_and_complete_on_return() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; this machine has none")
    live = _state("cuda")
    big = torch.randn(
        64 << 20, device="cuda"
    )  # 256 MB: its copy is still in flight if not waited for
    live["big"] = big
    copy = host_copies(live)
    assert all(t.is_pinned() for t in (copy["weights"], copy["columns"], copy["big"]))
    assert torch.equal(copy["big"], big.cpu())
    _assert_copied(copy, live)


def test_a_copy_that_could_not_be_pinned_is_logged_once_with_its_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from freeride_lab.sidetasks import host_copy

    monkeypatch.setattr(host_copy, "_said_unpinned", False)
    with caplog.at_level("WARNING", logger=host_copy.__name__):
        host_copy._unpinned(RuntimeError("CUDA error: out of memory (cudaHostAlloc)"), 4096)
        host_copy._unpinned(RuntimeError("again"), 8192)
    assert [r.getMessage() for r in caplog.records] == [
        "host_copies: no page-locked memory for a 4096-byte copy (CUDA error: out of memory "
        "(cudaHostAlloc)); copying through pageable memory, waited for tensor by tensor"
    ]


@pytest.mark.gpu
def test_a_gpu_tensor_is_still_copied_where_memory_cannot_be_pinned(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; this machine has none")
    empty = torch.empty

    def no_pinning(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("pin_memory"):
            raise RuntimeError("CUDA error: out of memory (cudaHostAlloc)")
        return empty(*args, **kwargs)

    from freeride_lab.sidetasks import host_copy

    live = _state("cuda")
    monkeypatch.setattr(host_copy, "_said_unpinned", False)
    monkeypatch.setattr(torch, "empty", no_pinning)
    with caplog.at_level("WARNING", logger=host_copy.__name__):
        copy = host_copies(live)
    monkeypatch.undo()
    assert not copy["weights"].is_pinned()
    _assert_copied(copy, live)
    assert "cudaHostAlloc" in caplog.text
