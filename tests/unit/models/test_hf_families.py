"""Qwen3, Mixtral, Qwen3-MoE and DeepSeek-V3 from Hugging Face folders made on the spot, with
transformers as the oracle.

As tests/unit/models/test_hf_llama.py: a tiny random model of each family is saved with `save_pretrained`, the
engine loads it through `checkpoint.pretrained_dir` on one CPU rank in FP32 and must give the same
logits. The norms' weights and DeepSeek-V3's expert bias are randomised too (transformers makes
them ones and zeros), so that a norm or bias mapped to the wrong tensor shows in the logits. Each
model has a layer of each kind it can have (a dense first layer in the MoE families where the
family allows one), so the heterogeneous per-layer keys and the stacked ones are both exercised.
Measured largest differences: 6e-7 to 1.1e-6 (logits of standard deviation about 0.55).

DeepSeek-V3's multi-token prediction layer, which transformers neither runs nor saves, is checked by
adding the published tensors to a folder and loading them; the configurations Megatron-Core would
compute differently are refused, naming the config.json key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.hf_oracle import engine_from_hf, gpt_logits, hf_config
from tests.unit.training.test_engine import one_rank  # noqa: F401  (the module's one-rank process group)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_rank")

VOCAB = 200  # not a multiple of 128: Megatron pads the embedding
TOKENS = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(1))
# Weights wider than transformers' default 0.02, so that attention is far from uniform and a RoPE
# or YaRN mistake shows in the logits well above the tolerance (DeepSeek-V3 with mscale_all_dim
# dropped: 4e-4 at 0.02, 0.12 at 0.1).
INIT = 0.1


def save(model_class: Any, config: Any, folder: Path) -> torch.nn.Module:
    """A random model of `config`, its norms and router biases randomised, saved in `folder`."""
    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith("norm.weight"):
                tensor.add_(0.2 * torch.randn_like(tensor))
            elif name.endswith("e_score_correction_bias"):
                tensor.copy_(0.1 * torch.randn_like(tensor))
    model.save_pretrained(folder)
    return model


def assert_logits_match(
    reference: torch.nn.Module, folder: Path, run_dir: Path, weights: Path | None = None
) -> float:
    """Our logits against transformers' (asserted within 1e-5); returns the largest difference.
    `weights`: load these (an imported checkpoint) instead of the folder itself."""
    cfg = hf_config(folder, run_dir)
    if weights is not None:
        cfg.checkpoint.pretrained_dir = str(weights)
    trainer = engine_from_hf(cfg, run_dir)
    try:
        ours = gpt_logits(trainer, TOKENS)
        with torch.no_grad():
            theirs = reference(TOKENS).logits
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
        return float((ours - theirs).abs().max())
    finally:
        trainer.close()


def test_qwen3_logits_match_transformers(tmp_path: Path) -> None:
    config = transformers.Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,  # wider than hidden / heads: kv_channels
        rope_theta=1_000_000.0,
        tie_word_embeddings=False,
        initializer_range=INIT,
    )
    reference = save(transformers.Qwen3ForCausalLM, config, tmp_path / "hf")
    model = hf_config(tmp_path / "hf", tmp_path / "run").model
    assert model.qk_layernorm and model.kv_channels == 16
    assert_logits_match(reference, tmp_path / "hf", tmp_path / "run")


def test_mixtral_logits_match_transformers(tmp_path: Path) -> None:
    config = transformers.MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        initializer_range=INIT,
    )
    reference = save(transformers.MixtralForCausalLM, config, tmp_path / "hf")
    model = hf_config(tmp_path / "hf", tmp_path / "run").model
    assert model.num_moe_experts == 4 and not model.moe_router_pre_softmax
    assert_logits_match(reference, tmp_path / "hf", tmp_path / "run")


def tiny_qwen2(folder: Path, tied: bool = True) -> torch.nn.Module:
    """Qwen2.5's layout: q/k/v biases (randomised by the init like the weights), GQA; `tied` as
    the 0.5B-3B models publish. The window settings are the published ones (off)."""
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=1_000_000.0,
        tie_word_embeddings=tied,
        use_sliding_window=False,
        sliding_window=32768,
        max_window_layers=2,
        initializer_range=INIT,
    )
    model = save(transformers.Qwen2ForCausalLM, config, folder)
    with torch.no_grad():  # transformers inits biases to zero: make them count, and save again
        for name, param in model.named_parameters():
            if name.endswith("_proj.bias"):
                param.copy_(0.5 * torch.randn_like(param))
    model.save_pretrained(folder)
    return model


def tiny_mistral(folder: Path, window: int | None = None) -> torch.nn.Module:
    """A head dimension wider than hidden / heads (Mistral-Nemo's kind); `window`: v0.1's
    sliding window (at the 32 test tokens, one as long as the sequence cuts nothing off)."""
    config = transformers.MistralConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=window,
        rope_theta=1_000_000.0,
        initializer_range=INIT,
    )
    return save(transformers.MistralForCausalLM, config, folder)


def tiny_phi3(folder: Path, window: int | None = 32) -> torch.nn.Module:
    """Fused qkv_proj and gate_up_proj with GQA (Phi-3-medium's 4 query heads per group, here 2),
    so that the per-group interleaving of the split is exercised; the published 4K models' window
    (2047 there, as long as the test's sequence here)."""
    config = transformers.Phi3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        original_max_position_embeddings=64,
        sliding_window=window,
        initializer_range=INIT,
        bos_token_id=None,  # Phi-3's ids (32000...) lie outside the tiny vocabulary
        eos_token_id=None,
        pad_token_id=None,
    )
    return save(transformers.Phi3ForCausalLM, config, folder)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_qwen2_logits_match_transformers(tmp_path: Path, tied: bool) -> None:
    reference = tiny_qwen2(tmp_path / "hf", tied)
    model = hf_config(tmp_path / "hf", tmp_path / "run").model
    assert model.add_qkv_bias and not model.add_bias_linear
    assert model.share_embeddings_and_output_weights == tied
    assert_logits_match(reference, tmp_path / "hf", tmp_path / "run")


@pytest.mark.parametrize("window", [None, 32], ids=["full", "window_of_the_sequence"])
def test_mistral_logits_match_transformers(tmp_path: Path, window: int | None) -> None:
    reference = tiny_mistral(tmp_path / "hf", window)
    model = hf_config(tmp_path / "hf", tmp_path / "run").model
    assert model.kv_channels == 16 and not model.add_qkv_bias
    assert_logits_match(reference, tmp_path / "hf", tmp_path / "run")


def test_phi3_logits_match_transformers(tmp_path: Path) -> None:
    reference = tiny_phi3(tmp_path / "hf")
    model = hf_config(tmp_path / "hf", tmp_path / "run").model
    assert (model.num_attention_heads, model.num_query_groups) == (4, 2)
    assert_logits_match(reference, tmp_path / "hf", tmp_path / "run")


def test_a_window_shorter_than_the_sequence_is_what_the_checker_refuses(tmp_path: Path) -> None:
    """The oracle for `attention_span`: at 32 tokens a window of 16 changes transformers' logits
    (so whole-sequence attention would not be the folder's model), and a training length above
    the window is refused naming sliding_window; at the window's length it is accepted."""
    from config.rules.pretrained import pretrained_problems

    windowed = tiny_phi3(tmp_path / "w16", window=16)
    full = tiny_phi3(tmp_path / "full", window=None)
    with torch.no_grad():
        assert (windowed(TOKENS).logits - full(TOKENS).logits).abs().max() > 1e-3
    model = hf_config(tmp_path / "w16", tmp_path / "run", seq_length=32).model
    [problem] = pretrained_problems(model, tmp_path / "w16", "w16")
    assert problem.field == "model.seq_length" and "sliding_window" in problem.message
    assert "set model.seq_length to 16 or less (e.g. 16)" in problem.message
    model.seq_length = 16
    assert pretrained_problems(model, tmp_path / "w16", "w16") == []


def tiny_qwen3_moe(folder: Path, normalised: bool, dense: list[int]) -> torch.nn.Module:
    """Four experts, top 2; `dense`: mlp_only_layers (the first layers without experts)."""
    config = transformers.Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        moe_intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=normalised,
        mlp_only_layers=dense,
        initializer_range=INIT,
    )
    return save(transformers.Qwen3MoeForCausalLM, config, folder)


@pytest.mark.parametrize(
    "normalised, dense", [(True, []), (False, [0])], ids=["norm_topk", "pre_softmax_dense_first"]
)
def test_qwen3_moe_logits_match_transformers(
    tmp_path: Path, normalised: bool, dense: list[int]
) -> None:
    reference = tiny_qwen3_moe(tmp_path / "hf", normalised, dense)
    model = hf_config(tmp_path / "hf", tmp_path / "run").model
    assert model.moe_router_pre_softmax == (not normalised)
    assert model.moe_first_k_dense_layers == len(dense)
    assert_logits_match(reference, tmp_path / "hf", tmp_path / "run")


def tiny_deepseek_v3(folder: Path, yarn: bool) -> torch.nn.Module:
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": 10000.0}
    if yarn:  # DeepSeek-V3's published form with smaller numbers; mscale_all_dim as DeepSeek-V2
        rope = {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 16,  # below the 32 tokens: the ramp matters
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 0.707,
        }
    config = transformers.DeepseekV3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        moe_intermediate_size=16,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=24,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=12,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        n_shared_experts=1,
        first_k_dense_replace=1,
        routed_scaling_factor=2.5,
        max_position_embeddings=64,
        rope_parameters=rope,
        initializer_range=INIT,
    )
    return save(transformers.DeepseekV3ForCausalLM, config, folder)


@pytest.mark.parametrize("yarn", [False, True], ids=["rope", "yarn"])
def test_deepseek_v3_logits_match_transformers(tmp_path: Path, yarn: bool) -> None:
    reference = tiny_deepseek_v3(tmp_path / "hf", yarn)
    model = hf_config(tmp_path / "hf", tmp_path / "run").model
    assert model.rope_scaling == ("yarn" if yarn else None)
    assert (model.moe_router_num_groups, model.moe_router_group_topk) == (2, 1)
    assert model.moe_shared_expert_intermediate_size == 16 and model.mtp_num_layers is None
    assert_logits_match(reference, tmp_path / "hf", tmp_path / "run")


def add_mtp_layer(folder: Path, layers: int) -> dict[str, torch.Tensor]:
    """The folder with DeepSeek-V3's published multi-token prediction layer added as layer
    `layers` (transformers saves none): a copy of the last MoE layer plus its own norms and
    projection, and the copies of the embedding and output layer the published files carry."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    last, mtp = f"model.layers.{layers - 1}.", f"model.layers.{layers}."
    added = {mtp + k[len(last) :]: v.clone() for k, v in tensors.items() if k.startswith(last)}
    generator = torch.Generator().manual_seed(2)
    hidden = tensors["model.norm.weight"].shape[0]
    for name in ("enorm", "hnorm", "shared_head.norm"):
        added[f"{mtp}{name}.weight"] = 1 + 0.2 * torch.randn(hidden, generator=generator)
    added[f"{mtp}eh_proj.weight"] = 0.1 * torch.randn(hidden, 2 * hidden, generator=generator)
    added[f"{mtp}embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    added[f"{mtp}shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file(tensors | added, folder / "model.safetensors", metadata={"format": "pt"})
    return added


def test_deepseek_v3_mtp_layer_loads_when_the_folder_has_one(tmp_path: Path) -> None:
    reference = tiny_deepseek_v3(tmp_path / "hf", yarn=False)
    added = add_mtp_layer(tmp_path / "hf", layers=3)
    cfg = hf_config(tmp_path / "hf", tmp_path / "run")
    assert cfg.model.mtp_num_layers == 1
    trainer = engine_from_hf(cfg, tmp_path / "run")  # every parameter must get a weight
    try:
        from training.checkpoint.state import model_chunks

        params = dict(model_chunks(trainer.model)["model"].named_parameters())
        for ours, theirs in [
            ("mtp.layers.0.eh_proj.weight", "eh_proj.weight"),
            ("mtp.layers.0.final_layernorm.weight", "shared_head.norm.weight"),
        ]:
            torch.testing.assert_close(params[ours], added[f"model.layers.3.{theirs}"])
        # The main head is unchanged by the MTP layer.
        with torch.no_grad():
            theirs = reference(TOKENS).logits
        torch.testing.assert_close(gpt_logits(trainer, TOKENS), theirs, rtol=1e-5, atol=1e-5)
    finally:
        trainer.close()


QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 48,
    "moe_intermediate_size": 24,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
}


@pytest.mark.parametrize("key", ["num_experts", "num_local_experts"])
def test_qwen3_moe_takes_the_expert_count_under_either_transformers_name(key: str) -> None:
    from models.hf import qwen3_moe

    assert qwen3_moe.to_model(QWEN3_MOE | {key: 4}, set()).num_moe_experts == 4


@pytest.mark.parametrize(
    "change, key",
    [
        ({"decoder_sparse_step": 2}, "decoder_sparse_step"),
        ({"mlp_only_layers": [1]}, "mlp_only_layers"),
        ({"use_sliding_window": True}, "use_sliding_window"),
    ],
)
def test_qwen3_moe_refuses_layer_patterns_it_cannot_model(change: dict, key: str) -> None:
    from models.hf import qwen3_moe

    with pytest.raises(ValueError, match=key):
        qwen3_moe.to_model(QWEN3_MOE | {"num_experts": 4} | change, set())


@pytest.mark.parametrize(
    "change, key",
    [
        ({"norm_topk_prob": False}, "norm_topk_prob"),
        ({"topk_group": 2}, "topk_group"),  # top 2 of 2 groups: groups ranked by their best 1
        ({"rope_interleave": False}, "rope_interleave"),
    ],
)
def test_deepseek_v3_refuses_routing_megatron_computes_differently(change: dict, key: str) -> None:
    from models.hf import deepseek_v3

    hf = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 48,
        "moe_intermediate_size": 16,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "q_lora_rank": 24,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 8,
        "v_head_dim": 12,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
    }
    assert deepseek_v3.to_model(hf, set()).moe_router_num_groups == 2
    with pytest.raises(ValueError, match=key):
        deepseek_v3.to_model(hf | change, set())


def tiny(family: str, folder: Path) -> torch.nn.Module:
    """One tiny model per family, for the round trips below."""
    if family == "deepseek_v3":
        return tiny_deepseek_v3(folder, yarn=True)
    if family == "qwen2":
        return tiny_qwen2(folder, tied=True)
    if family == "mistral":
        return tiny_mistral(folder)
    if family == "phi3":
        return tiny_phi3(folder)
    return tiny_qwen3_moe(folder, normalised=False, dense=[0])  # transformers' default norm


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3", "qwen2", "mistral", "phi3"])
def test_import_then_export_gives_every_tensor_back_bit_for_bit(
    tmp_path: Path, family: str
) -> None:
    """`recipes import` then `export`: every tensor back bit for bit, DeepSeek-V3's MTP layer and
    its copies of the embedding and output layer (kept as extras) included."""
    from recipes.cli import main
    from training.hf.convert import iter_tensors

    reference = tiny(family, tmp_path / "hf")
    if family == "deepseek_v3":
        add_mtp_layer(tmp_path / "hf", layers=3)
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
    # The imported checkpoint (TE's names for the MoE and MLA norms) starts a CPU run (the local
    # spec's names) with transformers' logits.
    assert_logits_match(reference, tmp_path / "hf", tmp_path / "run", tmp_path / "imported")
    assert main(["export", str(tmp_path / "imported"), str(tmp_path / "back")]) == 0
    original, back = dict(iter_tensors(tmp_path / "hf")), dict(iter_tensors(tmp_path / "back"))
    assert sorted(back) == sorted(original)
    for name, value in original.items():
        assert torch.equal(back[name], value), name


DENSE = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
LONGROPE = {
    "short_factor": [1.0] * 4,
    "long_factor": [2.0] * 4,
    "original_max_position_embeddings": 4096,
}


@pytest.mark.parametrize(
    "family, change, named",
    [
        ("qwen2", {"use_sliding_window": True}, "use_sliding_window"),
        ("qwen2", {"rope_scaling": {"type": "yarn", "factor": 4.0}}, "yarn"),
        ("mistral", {"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
        ("phi3", {"rope_scaling": {"type": "longrope", **LONGROPE}}, "longrope"),
        ("phi3", {"rope_scaling": {"type": "su", **LONGROPE}}, "'su'"),
        ("phi3", {"partial_rotary_factor": 0.75}, "partial_rotary_factor"),
        # Llama's attention_bias alone (q, k, v and o): the message says what can be modelled
        # and where a Qwen2 folder belongs.
        ("llama", {"attention_bias": True}, "Qwen2ForCausalLM"),
    ],
)
def test_configurations_megatron_computes_differently_are_refused_by_name(
    family: str, change: dict, named: str
) -> None:
    from config.registry import HF_FAMILIES
    from models.hf import module_of

    name = next(n for n, f in HF_FAMILIES.items() if f.module == f"models.hf.{family}")
    module_of(name).to_model(DENSE | {"architectures": [name]}, set())  # the base is accepted
    with pytest.raises(ValueError, match=named):
        module_of(name).to_model(DENSE | {"architectures": [name]} | change, set())
