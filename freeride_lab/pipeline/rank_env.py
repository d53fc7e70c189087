"""``RankEnv``: a training rank's place in the job, from torchrun's environment variables."""

from __future__ import annotations

import os

__all__ = ["RankEnv"]


class RankEnv:
    """This process's place in the job, from torchrun's environment variables."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        missing = [k for k in ("RANK", "WORLD_SIZE") if k not in env]
        if missing:
            raise RuntimeError(
                f"environment variables {missing} are not set; start ranks with "
                "`python -m torch.distributed.run ... -m freeride_lab.pipeline.rank --run-dir DIR`"
            )
        self.rank = int(env["RANK"])
        self.world_size = int(env["WORLD_SIZE"])
        self.local_rank = int(env.get("LOCAL_RANK", "0"))

    def __repr__(self) -> str:
        return (
            f"RankEnv(rank={self.rank}, world_size={self.world_size}, local_rank={self.local_rank})"
        )
