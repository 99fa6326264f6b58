"""Every rule a config must pass before it may take a GPU hour, one module per section.

Each problem names the dotted field, the values involved and a fix. The rules mirror what
Megatron-Core would assert minutes into a job (or what would silently degrade it), so they run on a
login node in milliseconds. The rules read `finalize`'s partial values; what runs after the check
takes its complete values from `derive`, which the engine calls on every rank at start-up.
"""

from __future__ import annotations

from config.finalize import Derived, Partial, complete, finalize, missing
from config.hardware import Cluster
from config.problems import Problem
from config.registry import load
from config.rules.batch import batch
from config.rules.choices import choices
from config.rules.cluster import cluster_size
from config.rules.data import data
from config.rules.fsdp import fsdp
from config.rules.linear_attention import linear_attention
from config.rules.model import model
from config.rules.moe import moe
from config.rules.moe_overlap import moe_overlap
from config.rules.parallel import parallel, pipeline
from config.rules.peft import peft
from config.rules.precision import cpu, precision
from config.rules.pretrained import pretrained
from config.rules.ranges import ranges
from config.rules.training import training
from config.schema import TrainingConfig, model_arch
from config.tree import ConfigError

__all__ = ["Problem", "derive", "validate"]

# The numbers themselves, and the job's size, come first: the rules below divide by them and loop
# over them, so when these find anything, the others do not run.
FIRST = (ranges, cluster_size)
# Every config passes these; an architecture adds its own (its registry entry's `rules`).
RULES = (
    choices,
    parallel,
    pipeline,
    fsdp,
    batch,
    moe,
    moe_overlap,
    model,
    linear_attention,
    precision,
    cpu,
    data,
    training,
    pretrained,  # reads checkpoint.pretrained_dir's config.json when it is a Hugging Face folder
    peft,
)


def validate(
    cfg: TrainingConfig, cluster: Cluster, derived: Partial | None = None
) -> list[Problem]:
    """All problems of `cfg` on `cluster`; an empty list means it can run."""
    derived = derived or finalize(cfg, cluster)
    problems = [p for rule in FIRST for p in rule(cfg, cluster, derived)]
    if problems:
        return problems
    arch = model_arch(cfg)
    for rule in (*RULES, *(load(ref) for ref in (arch.rules if arch else ()))):
        problems += rule(cfg, cluster, derived)
    return problems


def derive(cfg: TrainingConfig, cluster: Cluster) -> Derived:
    """Every value that follows from `cfg` on `cluster`, for a config the checker accepts; else
    ConfigError naming each of `validate`'s problems. The estimate, the step-time model and the
    engine read these values, so none of them meets a value that could not be derived."""
    partial = finalize(cfg, cluster)
    problems = validate(cfg, cluster, partial)
    if problems:
        raise ConfigError([(p.field, p.message) for p in problems])
    derived = complete(partial)
    if derived is None:  # a value that no rule explains: a rule is missing, not the user's error
        lacking = ", ".join(missing(partial))
        raise ConfigError([("config", f"passes every rule, yet its {lacking} cannot be derived")])
    return derived
