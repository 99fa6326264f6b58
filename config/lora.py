"""What LoRA adapts: the target modules an architecture's layers hold, and the adapter factors' names.

Read by the checker's LoRA rule (config/rules/peft.py), the memory estimate, the adapters on the
ranks (training/lora.py) and the checkpoint and export code that tells adapters from base weights.
"""

from __future__ import annotations

from config.schema import ModelConfig, comma_names

# The names of the adapter factors, as parameters and in checkpoint keys (training/lora.py).
ADAPTER_NAMES = ("lora_A", "lora_B")


def is_adapter(name: str) -> bool:
    """Whether a parameter name or checkpoint key names an adapter factor."""
    return name.rsplit(".", 1)[-1] in ADAPTER_NAMES


def targets(text: str) -> list[str]:
    """peft.target_modules as a list of names."""
    return comma_names(text)


def present(model: ModelConfig) -> list[str]:
    """The LoRA targets this architecture's layers hold."""
    out = ["linear_proj"] if model.multi_latent_attention else ["linear_qkv", "linear_proj"]
    dense = not model.num_moe_experts or model.moe_first_k_dense_layers > 0
    if dense or model.moe_shared_expert_intermediate_size:
        out += ["linear_fc1", "linear_fc2"]
    return out
