"""The engine's entry point: `training.pretrain(config)` on every rank, or under plain torchrun:

    torchrun --nproc-per-node 8 -m training.entry --config resolved.yaml [field.path=value ...]

Nothing heavy is imported at module level: `import training` (and the CLI that checks configs)
stays free of torch and Megatron-Core; `pretrain` imports the engine when it runs.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import traceback
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from config import paths
from config.hardware import Cluster
from config.schema import TrainingConfig
from config.tree import ConfigError, apply_overrides, from_dict
from training.ranks import launch_from_env

if TYPE_CHECKING:
    from torch.distributed import Store

    from training.engine import Hook


def cluster_from_env(device: str) -> Cluster:
    """The Cluster this job runs on, from torchrun's environment and the visible device."""
    launch = launch_from_env()
    nodes, per_node = launch.num_nodes, launch.local_world_size
    if device == "cpu":
        return Cluster(num_nodes=nodes, gpus_per_node=per_node, gpu="cpu")
    import torch

    from config.hardware import gpu_from_device_name, gpu_kind_problem

    name = torch.cuda.get_device_name()
    kind = gpu_from_device_name(name)
    if kind is None:
        raise ConfigError([("cluster.gpu", f"this rank's device: {gpu_kind_problem(name)}")])
    return Cluster(num_nodes=nodes, gpus_per_node=per_node, gpu=kind)


def pretrain(
    config: TrainingConfig,
    hooks: Sequence[Hook] = (),
    store: Store | None = None,
    collective_timeout: timedelta | None = None,
) -> None:
    """Check `config` against the cluster this rank runs on, then train it (every rank calls this).

    `hooks`: more step hooks (training/engine.py `Hook`) after the checkpointer's, e.g. a test's.
    `store`: the process group's rendezvous store (training/inprocess.py), else torchrun's.
    `collective_timeout`: for every process group once the Trainer has built them (else 30 min).
    Raises config.tree.ConfigError, naming every problem, before any process group exists.
    """
    from config.cost.steptime import gemm_peak
    from config.rules import derive
    from training.distributed import resolve_device

    device = resolve_device(config.train.device)
    cluster = cluster_from_env(device)
    derived = derive(config, cluster)

    # All ranks must agree on a folder the config does not name: torchrun's run id (one per job)
    # stamps it.
    run_dir = paths.run_dir_for(config, os.environ.get("TORCHELASTIC_RUN_ID", "local"))
    run_dir.mkdir(parents=True, exist_ok=True)

    if device == "cpu":
        from training import cpu_mode

        cpu_mode.import_megatron_core()  # before the engine's imports: see there
    from training import distributed
    from training.checkpoint.store import Checkpointer, hold_run_folders
    from training.engine import Trainer
    from training.resilience.stop import StopPolicy
    from training.resilience.watchdog import watchdog_for

    # What exists before this run (a caller's default group) stays; whatever it builds goes.
    groups_before = distributed.process_groups()
    trainer = checkpoints = stop = folders = None
    failed = False
    # From before the rendezvous: a start-up that hangs is a hang too.
    watchdog = watchdog_for(config, launch_from_env().rank, run_dir)
    try:
        # Out of the collector's walk until the run ends: the ~400,000 objects of torch,
        # Megatron-Core and the caller, so that the collection below looks at this run's objects
        # only (0.2 s of CPU a run otherwise, on every rank; most of a refused start's cost).
        gc.freeze()
        distributed.init_process_group(launch_from_env(), device, store=store)
        # One run per run directory and checkpoint folder, before anything is written into them.
        folders = hold_run_folders(config, run_dir)
        if launch_from_env().rank == 0:
            paths.write_run_config(config, run_dir)
        # MFU against the peak the planner predicts it against; none on the CPU (a peak of 0).
        peak, _ = gemm_peak(config, cluster, derived)
        trainer = Trainer(config, derived, device, run_dir, peak or None)
        if collective_timeout is not None:
            distributed.set_collective_timeout(collective_timeout)
        checkpoints = Checkpointer(
            config,
            run_dir,
            device,
            model=trainer.model,
            optimizer=trainer.optimizer,
            states=trainer.checkpoint_states(),
        )
        checkpoints.resume()  # from the newest complete checkpoint, if any: job chains
        stop = StopPolicy(config.train.exit_duration_minutes, trainer.torch_device)
        trainer.train([checkpoints, *hooks], stop, resumed=checkpoints.resumed, watchdog=watchdog)
    except BaseException as err:
        failed = True
        # The frames this error passed through hold the model and the optimizer, and so their
        # process groups; whoever keeps the error (the in-process restart's Wrapper does) would
        # keep those too. Their locals go; the traceback still names every line.
        traceback.clear_frames(err.__traceback__)
        raise
    finally:
        if watchdog is not None:
            watchdog.stop()
        if stop is not None:
            stop.close()
        if checkpoints is not None:
            checkpoints.close(abort=failed)
        if trainer is not None:
            trainer.close()
        if folders is not None:
            folders.release()
        trainer = checkpoints = stop = folders = None
        distributed.destroy(keep=groups_before)
        # A destroyed group keeps its threads (gloo's workers, NCCL's watchdog) until the object
        # is freed, and the model that refers to it is held in reference cycles (module <->
        # DDP hooks <-> config): collect them now, not whenever the next collection happens.
        gc.collect()
        gc.unfreeze()  # what was there before is the collector's again, as it was


def run(config: TrainingConfig, hooks: Sequence[Hook] = ()) -> None:
    """`pretrain`, under nvidia-resiliency-ext's in-process restart with
    resilience.inprocess_restart."""
    if config.resilience.inprocess_restart:
        from training.inprocess import pretrain_restartable

        pretrain_restartable(pretrain, config, hooks)
    else:
        pretrain(config, hooks)


def load_config(path: str, overrides: list[str]) -> TrainingConfig:
    """A resolved config saved as YAML (e.g. <run_dir>/config.yaml), plus dotlist overrides."""
    import yaml

    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict):
        raise ConfigError([("--config", f"{path} does not hold a config mapping")])
    return apply_overrides(from_dict(TrainingConfig, data), overrides)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.entry", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--config", required=True, help="a resolved config YAML")
    parser.add_argument("overrides", nargs="*", help="dotlist overrides, e.g. train.max_steps=10")
    args = parser.parse_args(argv)
    from training import quiet

    quiet.install()  # before Megatron-Core is imported: most of its notices come at import
    try:
        run(load_config(args.config, args.overrides))
    except ConfigError as err:
        print(f"invalid config:\n{err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
