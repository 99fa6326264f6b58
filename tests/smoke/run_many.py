"""Train several resolved configs one after another in one torchrun launch: one process group.

    python -m torch.distributed.run --standalone --nproc-per-node W -m tests.smoke.run_many \\
        --config a.yaml --config b.yaml ...

Test helper (tests/smoke/test_catalog_shrink.py): every rank pays the Python, torch and
Megatron-Core imports and the gloo rendezvous once for the whole list instead of once per recipe.
The default process group is created here; `training.entry.pretrain` leaves a group it did not
create alone and tears down only Megatron-Core's model-parallel groups, so each config builds its
own layout on the same group. Each config trains as `python -m training.entry --config PATH` would
train it, into its own logging.run_dir; the engine's `Trainer.close` leaves no Megatron-Core
state behind that the next config could trip over.

Rank 0 prints `run_many: start NAME` and `run_many: done NAME` (NAME: the YAML file's stem), so the
caller can tell which config a failure belongs to. The first failure ends the launch with exit 1:
after an exception the ranks may be stopped at different collectives, and nothing run after that
would be trustworthy (torchrun then stops the other ranks).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

MARK = "run_many:"


def _say(rank: int, text: str) -> None:
    if rank == 0:  # one write: other ranks' lines cannot land inside it
        sys.stdout.write(f"{MARK} {text}\n")
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.smoke.run_many", description=__doc__)
    parser.add_argument("--config", action="append", required=True, help="a resolved config YAML")
    args = parser.parse_args(argv)

    import torch.distributed as dist

    from training import distributed
    from training.entry import load_config, pretrain
    from training.ranks import launch_from_env

    launch = launch_from_env()
    owns_group = distributed.init_process_group(launch, "cpu")
    for path in args.config:
        name = Path(path).stem
        _say(launch.rank, f"start {name}")
        try:
            pretrain(load_config(path, []))
            dist.barrier()  # "done" means done on every rank, not only on rank 0
        except BaseException:
            print(f"{MARK} failed {name} on rank {launch.rank}", file=sys.stderr)
            traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            # Not sys.exit: interpreter shutdown would tear down a gloo group whose peers may be
            # blocked in a collective, and could hang there instead of exiting.
            os._exit(1)
        _say(launch.rank, f"done {name}")
    if owns_group:
        distributed.destroy(process_group=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
