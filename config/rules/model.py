"""The architecture itself: layers, head dimension, query groups, recompute."""

from __future__ import annotations

from config.finalize import Derived
from config.hardware import Cluster
from config.problems import Problem
from config.schema import TrainingConfig


def model(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    model = cfg.model
    out = []
    if model.num_layers < 1:
        out.append(Problem("model.num_layers", f"must be at least 1, got {model.num_layers}"))
    if (
        model.kv_channels is None
        and not model.multi_latent_attention
        and model.hidden_size % model.num_attention_heads
    ):
        out.append(
            Problem(
                "model.num_attention_heads",
                f"hidden_size={model.hidden_size} is not divisible by num_attention_heads={model.num_attention_heads}; "
                "set model.kv_channels to the head dimension",
            )
        )
    groups = model.num_query_groups
    if groups is not None and (groups < 1 or model.num_attention_heads % groups):
        out.append(
            Problem(
                "model.num_query_groups",
                f"{groups} must divide num_attention_heads={model.num_attention_heads}",
            )
        )
    if model.recompute_granularity == "full" and model.recompute_method not in ("uniform", "block"):
        out.append(Problem("model.recompute_method", "full recompute needs 'uniform' or 'block'"))
    return out
