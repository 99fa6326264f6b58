"""What CPU activation offloading (model.cpu_offloading_num_layers) costs a step.

Megatron-Core hands each decoder layer's forward to Transformer Engine's offload hooks (its
cpu_offloading): once one of the first n layers has run forward, what it saved for its backward is
copied to pinned host memory on a side stream while the next layer computes, and in the backward it
comes back one layer ahead, while the layer after it computes its backward. A copy costs the step
only what that neighbour's compute does not cover: on PCIe (63 GB/s one way) a large layer's
activations take longer to move than its forward takes to compute, over NVLink-C2C (GH200, GB200)
seldom. config/cost/memory.py counts what stays on the GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

from config.cost import layers
from config.cost.memory import layer_saved_bytes
from config.finalize import Derived
from config.hardware import Cluster
from config.schema import ModelConfig, TrainingConfig


def offloaded_layers(m: ModelConfig) -> tuple[int, int]:
    """(dense, MoE) decoder layers among the first model.cpu_offloading_num_layers, whose
    activations go to the host (Transformer Engine's hooks take the layers in order)."""
    n = m.cpu_offloading_num_layers
    dense = min(n, layers.first_moe_layer(m))
    return dense, n - dense


def exposed_seconds(
    cfg: TrainingConfig,
    cluster: Cluster,
    derived: Derived,
    layer_seconds: Sequence[float],
    efficiency: float,
) -> float:
    """Seconds per microbatch the host copies add: for each offloaded layer, its copy out less the
    next layer's forward, and its copy back less the next layer's backward (a layer's forward is a
    third of its `layer_seconds`, dense and MoE, the backward two thirds). `efficiency` is the
    share of the host link's figure the copies reach (constants.py host_link)."""
    rate = cluster.spec.host_gb_s * 1e9 * efficiency
    if cfg.model.cpu_offloading_num_layers <= 0 or rate <= 0:
        return 0.0
    out = 0.0
    for count, moe, seconds in zip(
        offloaded_layers(cfg.model), (False, True), layer_seconds, strict=True
    ):
        if count:
            copy = layer_saved_bytes(cfg, derived, moe) / rate
            out += count * (max(0.0, copy - seconds / 3) + max(0.0, copy - 2 * seconds / 3))
    return out
