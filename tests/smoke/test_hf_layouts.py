"""A Hugging Face folder loads into every layout, each rank reading its own slices.

Oracle: the folder itself. Each layout trains one step at learning rate 0 (the first step of the
linear warmup), so the weights it saves at the end are exactly the ones it loaded; the checkpoint
is then exported with `recipes export` and every tensor must equal the folder's bit for bit. A
rank that read a wrong slice (a QKV group, a half of fc1, an expert, a layer of another pipeline
stage or virtual chunk) would save it, and the comparison names the tensor. The logits themselves
are compared with transformers' in tests/unit/models/test_hf_llama.py and tests/unit/models/test_hf_families.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from config.tree import write_yaml
from recipes.cli import main
from tests.smoke.conftest import _env
from tests.smoke.run_many import launch_many
from tests.support.hf_oracle import hf_config

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.smoke


def _save(model: torch.nn.Module, folder: Path) -> Path:
    model.save_pretrained(folder)
    return folder


def llama(folder: Path) -> Path:
    config = transformers.LlamaConfig(
        vocab_size=200,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    return _save(transformers.LlamaForCausalLM(config), folder)


def mixtral(folder: Path) -> Path:
    config = transformers.MixtralConfig(
        vocab_size=200,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    return _save(transformers.MixtralForCausalLM(config), folder)


def qwen3(folder: Path) -> Path:
    config = transformers.Qwen3Config(
        vocab_size=200,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )
    torch.manual_seed(0)
    return _save(transformers.Qwen3ForCausalLM(config), folder)


def family(name: str) -> Callable[[Path], Path]:
    """The tiny model of tests/unit/models/test_hf_families.py `tiny(name)`, saved in a folder."""

    def make(folder: Path) -> Path:
        from tests.unit.models.test_hf_families import tiny

        tiny(name, folder)
        return folder

    return make


def qwen3_moe(folder: Path) -> Path:
    from tests.unit.models.test_hf_families import tiny

    tiny("qwen3_moe", folder)
    return folder


def deepseek_v3(folder: Path) -> Path:
    from tests.unit.models.test_hf_families import add_mtp_layer, tiny

    tiny("deepseek_v3", folder)
    add_mtp_layer(folder, layers=3)  # the published checkpoints' MTP layer, on the last stage
    return folder


def gpt_oss(folder: Path) -> Path:
    from tests.unit.models.test_hf_gpt_oss import save, tiny_config

    save(tiny_config(), folder)  # a windowed and a full layer, sinks, biased experts and router
    return folder


def qwen3_5(folder: Path) -> Path:
    from tests.unit.models.test_hf_qwen3_5 import tiny_dense

    tiny_dense(folder)  # 8 layers: Gated DeltaNet x 3, attention, twice
    return folder


def qwen3_5_moe(folder: Path) -> Path:
    from tests.unit.models.test_hf_qwen3_5 import tiny_moe

    tiny_moe(folder)
    return folder


LAYOUTS = {
    "llama_tp2": (llama, {"tensor_model_parallel_size": 2}),
    "llama_pp2_vpp2": (
        llama,
        {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2},
    ),
    # MoE with TP > 1 needs sequence parallel, which the CPU mode lacks: EP here.
    "mixtral_ep2": (mixtral, {"expert_model_parallel_size": 2}),
    "qwen3_tp2": (qwen3, {"tensor_model_parallel_size": 2}),
    # Qwen2's q/k/v biases split with their query groups, its embedding tied to the output layer.
    "qwen2_tp2": (family("qwen2"), {"tensor_model_parallel_size": 2}),
    # Phi-3's fused qkv_proj and gate_up_proj: each TP rank reads its groups' rows out of them.
    "phi3_tp2": (family("phi3"), {"tensor_model_parallel_size": 2}),
    "mistral_pp2": (family("mistral"), {"pipeline_model_parallel_size": 2}),
    "qwen3_moe_ep2": (qwen3_moe, {"expert_model_parallel_size": 2}),
    "deepseek_v3_ep2": (deepseek_v3, {"expert_model_parallel_size": 2}),
    "deepseek_v3_pp2": (deepseek_v3, {"pipeline_model_parallel_size": 2}),
    "gpt_oss_ep2": (gpt_oss, {"expert_model_parallel_size": 2}),
    # Each TP rank holds half the heads' sinks; the experts stay whole (ETP 1: their biases).
    "gpt_oss_tp2": (
        gpt_oss,
        {
            "tensor_model_parallel_size": 2,
            "sequence_parallel": True,
            "expert_tensor_parallel_size": 1,
        },
    ),
    # Gated DeltaNet's in_proj and conv1d parts, A_log and dt_bias split over TP by head groups.
    "qwen3_5_tp2": (qwen3_5, {"tensor_model_parallel_size": 2, "sequence_parallel": True}),
    "qwen3_5_pp2_vpp2": (
        qwen3_5,
        {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2},
    ),
    "qwen3_5_moe_ep2": (qwen3_5_moe, {"expert_model_parallel_size": 2}),
}
# Not here: LLaVA, whose training step needs images (a one-stage model: TP is its only split,
# the same TP slicing as the language model's); its logits are compared on one rank.


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    from training.hf.convert import iter_tensors

    return dict(iter_tensors(folder))


def test_every_layout_loads_exactly_the_folders_weights(tmp_path: Path) -> None:
    configs, folders = [], {}
    for name, (make, parallel) in LAYOUTS.items():
        folder = make(tmp_path / "hf" / name)
        cfg = hf_config(folder, tmp_path / name, **parallel)
        cfg.name = name
        cfg.scheduler.warmup_steps = 10  # step 1 runs at LR 0: the weights stay as loaded
        cfg.scheduler.decay_steps = 20
        cfg.train.global_batch_size = 4
        folders[name] = folder
        configs.append(write_yaml(cfg, tmp_path / "configs" / f"{name}.yaml"))
    outcomes = launch_many(configs, 2, _env(tmp_path), tmp_path / "logs")
    for name, folder in folders.items():
        assert outcomes[name].error is None, outcomes[name].failure(name)
        out = tmp_path / "export" / name
        assert main(["export", str(tmp_path / name / "checkpoints"), str(out)]) == 0
        assert_loaded_as_saved(tensors(folder), tensors(out), name)


def assert_loaded_as_saved(
    original: dict[str, torch.Tensor], exported: dict[str, torch.Tensor], name: str
) -> None:
    """Every tensor as in the folder, bit for bit, but DeepSeek-V3's expert bias: it moves by the
    step's expert load whatever the LR (Megatron-Core's default update rate: 1e-3 per step)."""
    assert sorted(exported) == sorted(original), name
    for key, value in original.items():
        assert exported[key].dtype == value.dtype, (name, key)
        if key.endswith("e_score_correction_bias"):
            assert (exported[key] - value).abs().max() <= 1e-3 + 1e-6, (name, key)
        else:
            assert torch.equal(exported[key], value), (name, key)
