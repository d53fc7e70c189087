"""CUDA side tasks for the GPU tests, loaded by file path ("…/gpu_tasks.py:CudaHog")."""

from __future__ import annotations

from typing import Any

import torch

from freeride_lab.sidetasks.api import IterativeSideTask


class CudaHog(IterativeSideTask):
    """Keeps ``chunk_mib`` more device memory per step (until its cap stops it)."""

    unit = "chunks"

    def __init__(self, chunk_mib: int = 256) -> None:
        super().__init__(chunk_mib=chunk_mib)
        self.chunk_mib = chunk_mib
        self.kept: list[torch.Tensor] = []

    def step(self) -> float:
        self.kept.append(torch.empty(self.chunk_mib << 20, dtype=torch.uint8, device=self.device))
        return 1.0


class CudaSpin(IterativeSideTask):
    """Compute-bound steps: ``matmuls`` products of a ``size``² matrix, waited for, so a step
    takes longer when the task gets fewer SMs."""

    unit = "matmuls"

    def __init__(self, size: int = 4096, matmuls: int = 4) -> None:
        super().__init__(size=size, matmuls=matmuls)
        self.size = size
        self.matmuls = matmuls

    def setup(self) -> None:
        self.a = torch.randn(self.size, self.size)

    def step(self) -> float:
        for _ in range(self.matmuls):
            self.b = self.a @ self.a
        torch.cuda.synchronize(self.device)
        return float(self.matmuls)

    def state_dict(self) -> dict[str, Any]:
        return {"progress": self.progress}


class CudaAsyncSleep(IterativeSideTask):
    """Each step queues a GPU spin of ``cycles`` clock cycles and returns at once, without
    waiting: the step is only over when the GPU is done with it."""

    unit = "sleeps"

    def __init__(self, cycles: int = 100_000_000) -> None:
        super().__init__(cycles=cycles)
        self.cycles = cycles

    def step(self) -> float:
        torch.cuda._sleep(self.cycles)  # ≥ 50 ms at the H200's top clock of 1.98 GHz
        return 1.0
