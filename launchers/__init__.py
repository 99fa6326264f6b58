"""Launching a checked recipe: where it runs (executors) and with what environment.

    profile.py   the cluster profile (--profile NAME|FILE, TOML): account, partition, time, mounts, ...
    env.py       environment variables by owner (recipe, launcher, profile) and secrets by name
    mounts.py    container mounts: host paths inside the container, refusing unmounted outputs
    local.py     the local executor: NeMo-Run's LocalExecutor running torchrun in the foreground
    slurm.py     the Slurm executors (pyxis, Apptainer, bare): what one node runs; a job's values
    sbatch.py    renders a job with templates/sbatch.sh.j2 and submits it (chains of K jobs)

`recipes/launch.py` (`recipes run`) ties them together; profiles/ holds example profiles.
"""
