"""Golden sbatch scripts: one per Slurm executor, rendered from the example profiles.

Deterministic by construction: a fixed run directory (no clock), the profiles' fixed job
directories, and a fixed "user environment" holding two secrets, so that each golden also shows
how secrets are forwarded by name. `make golden` rewrites them (tests/support/refresh_golden.py).
"""

from __future__ import annotations

from pathlib import Path

from config.tree import apply_overrides
from launchers.profile import load_profile
from launchers.sbatch import render
from launchers.slurm import slurm_job
from recipes.registry import get

PROFILES = Path(__file__).parents[2] / "launchers" / "profiles"
GOLDEN = Path(__file__).parents[1] / "golden" / "sbatch"
# What the submitting shell holds; the values must never appear in a script.
USER_ENV = {
    "WANDB_API_KEY": "golden-secret-value",
    "HF_TOKEN": "golden-secret-value",
    "HOME": "/home/me",
}

# (golden name, profile, recipe, nodes, CPU mode, overrides)
CASES = [
    ("slurm", "slurm.toml", "llama3_8b_pretrain", 2, False, ()),
    ("slurm-apptainer", "slurm-apptainer.toml", "llama3_8b_pretrain", 2, False, ()),
    ("slurm-bare", "slurm-bare.toml", "llama3_8b_pretrain", 2, False, ()),
    ("slurm-bare-cpu", "slurm-bare.toml", "tiny_gpt_pretrain", 1, True, ()),
    # nvidia-resiliency-ext's launcher in a pyxis container, no requeue (the image is checked
    # when the job starts; a bare-metal venv before launch)
    (
        "slurm-ft-launcher",
        "slurm.toml",
        "llama3_8b_pretrain",
        2,
        False,
        ("resilience.ft_launcher=true", "resilience.max_requeues=0"),
    ),
]


def golden_script(
    profile_file: str, recipe: str, nodes: int, cpu: bool, overrides: tuple[str, ...] = ()
) -> str:
    profile = load_profile(PROFILES / profile_file)
    cfg = apply_overrides(get(recipe).config(), list(overrides))
    procs = profile.gpus_per_node or 8
    if cpu:
        cfg.train.device, procs = "cpu", 2
    run_root = profile.run_root or "/runs"
    _, job = slurm_job(
        cfg,
        profile,
        nodes=nodes,
        procs_per_node=procs,
        run_dir=f"{run_root}/{recipe}-golden",
        user_env=USER_ENV,
    )
    return render(job)


def sbatch_goldens() -> dict[Path, str]:
    return {
        GOLDEN / f"{name}.sbatch": golden_script(profile, recipe, nodes, cpu, overrides)
        for name, profile, recipe, nodes, cpu, overrides in CASES
    }
