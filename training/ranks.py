"""Where this process sits, as torchrun tells it (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE).

The one reader of torchrun's environment; torch-free, so the entry point can size the cluster and
pick the writing rank before anything heavy is imported. Started without torchrun (plain
`python`), a process is rank 0 of a world of 1.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Launch:
    """Where this process sits, as torchrun tells it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @property
    def num_nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))


def launch_from_env(env: Mapping[str, str] = os.environ) -> Launch:
    world = int(env.get("WORLD_SIZE", "1"))
    return Launch(
        rank=int(env.get("RANK", "0")),
        world_size=world,
        local_rank=int(env.get("LOCAL_RANK", "0")),
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world))),
    )
