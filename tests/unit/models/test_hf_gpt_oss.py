"""GPT-OSS from Hugging Face folders made on the spot, with transformers as the oracle.

A tiny random GptOssForCausalLM (a windowed and a full-attention layer, four experts, YaRN with
the ramp inside the 32 test tokens) is saved with `save_pretrained`; the engine loads it through
`checkpoint.pretrained_dir` on one CPU rank in FP32 (Megatron-Core's local attention, which computes
the sinks and the window in torch) and must give transformers' logits (its eager attention: GPT-OSS
has no SDPA path there). Every bias, the sinks and the norms are randomised, and the clamp of the
experts' GLU is set low enough to bite, so a tensor mapped to the wrong place or a clamp missed
shows in the logits. MXFP4 experts, as the published checkpoints store them, are dequantized on
import exactly as transformers' own dequantization does.
"""

from __future__ import annotations

import json
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
INIT = 0.1  # wide weights: attention far from uniform, so RoPE/YaRN or window mistakes show


def tiny_config(**change: Any) -> Any:
    fields: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=24,
        num_hidden_layers=2,  # layer_types: sliding, full (transformers' default pattern)
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=6,  # of 32 tokens: the window matters
        swiglu_limit=0.3,  # low enough that both clamps act on these weights
        max_position_embeddings=512,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "original_max_position_embeddings": 16,  # below the 32 tokens: the ramp matters
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
        },
        initializer_range=INIT,
    )
    return transformers.GptOssConfig(**(fields | change))


def save(config: Any, folder: Path) -> torch.nn.Module:
    """A random model, its norms and every bias randomised, saved in `folder`."""
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name.endswith("norm.weight"):
                tensor.add_(0.2 * torch.randn_like(tensor))
            elif name.endswith("bias") or name.endswith("sinks"):
                tensor.copy_(0.5 * torch.randn_like(tensor))
    model.save_pretrained(folder)
    return model


def assert_logits_match(
    reference: torch.nn.Module, folder: Path, run_dir: Path, weights: Path | None = None
) -> float:
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


def test_the_folder_gives_gpt_oss_architecture(tmp_path: Path) -> None:
    save(tiny_config(), tmp_path / "hf")
    model = hf_config(tmp_path / "hf", tmp_path / "run").model
    assert (model.window_size, model.window_attn_skip_freq) == (5, 2)
    assert model.softmax_type == "learnable" and model.add_bias_linear
    assert (model.activation, model.activation_func_clamp_value, model.glu_linear_offset) == (
        "quick_geglu",
        0.3,
        1.0,
    )
    assert model.rope_scaling == "yarn" and not model.rope_correction_range_round_to_int
    assert model.moe_router_load_balancing_type == "none"  # output_router_logits false


def test_logits_match_transformers(tmp_path: Path) -> None:
    reference = save(tiny_config(), tmp_path / "hf")
    assert_logits_match(reference, tmp_path / "hf", tmp_path / "run")


def test_packed_rows_match_each_sample_alone(tmp_path: Path) -> None:
    """Packed SFT rows (samples of 10, 15 and 7 tokens in a row of 32, kept apart by the
    block-diagonal mask of models/gpt.py) through the torch attention with sinks and the window:
    each sample's logits are transformers' for that sample alone. RoPE and YaRN rotate by relative
    position, so a sample's offset in the row does not matter."""
    from models.gpt import attention_mask
    from models.sdpa import SdpaAttention
    from training.checkpoint.state import model_chunks

    reference = save(tiny_config(), tmp_path / "hf")
    trainer = engine_from_hf(hf_config(tmp_path / "hf", tmp_path / "run"), tmp_path / "run")
    try:
        chunk = model_chunks(trainer.model)["model"].eval()
        layers = chunk.decoder.layers
        assert all(type(x.self_attention.core_attention) is SdpaAttention for x in layers)
        lengths = [10, 15, 7]
        segments = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))
        segments = segments.unsqueeze(0).expand(2, -1)
        positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0).expand(2, -1)
        with torch.no_grad():
            ours = chunk(TOKENS, positions, attention_mask(segments))[..., :VOCAB]
            start = 0
            for n in lengths:
                theirs = reference(TOKENS[:, start : start + n]).logits
                torch.testing.assert_close(ours[:, start : start + n], theirs, rtol=1e-5, atol=1e-5)
                start += n
    finally:
        trainer.close()


@pytest.mark.parametrize(
    "change",
    [
        {"layer_types": ["sliding_attention", "sliding_attention"]},
        {"layer_types": ["full_attention", "full_attention"]},
        {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
    ],
    ids=["all_windowed", "no_window", "plain_rope"],
)
def test_other_layer_patterns_and_plain_rope_match_transformers(
    tmp_path: Path, change: dict[str, Any]
) -> None:
    reference = save(tiny_config(**change), tmp_path / "hf")
    assert_logits_match(reference, tmp_path / "hf", tmp_path / "run")


def test_window_off_by_one_would_show(tmp_path: Path) -> None:
    """The same weights under a window one token wider give other logits than transformers'
    (by far more than the tolerance): the window's size is checked by the tests above."""
    import shutil

    reference = save(tiny_config(), tmp_path / "hf")
    shutil.copytree(tmp_path / "hf", tmp_path / "wider")
    config = json.loads((tmp_path / "wider" / "config.json").read_text())
    (tmp_path / "wider" / "config.json").write_text(json.dumps(config | {"sliding_window": 7}))
    trainer = engine_from_hf(hf_config(tmp_path / "wider", tmp_path / "run"), tmp_path / "run")
    try:
        with torch.no_grad():
            theirs = reference(TOKENS).logits
        assert (gpt_logits(trainer, TOKENS) - theirs).abs().max() > 1e-3
    finally:
        trainer.close()


@pytest.mark.parametrize(
    "change, key",
    [
        ({"swiglu_alpha": 1.5}, "swiglu_alpha"),
        ({"attention_bias": False}, "attention_bias"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
        ({"num_experts_per_tok": 1}, "num_experts_per_tok"),
        ({"quantization_config": {"quant_method": "bitsandbytes"}}, "quant_method"),
    ],
)
def test_refuses_what_megatron_computes_differently(change: dict[str, Any], key: str) -> None:
    from models.hf import gpt_oss

    hf = tiny_config().to_dict() | change
    with pytest.raises(ValueError, match=key):
        gpt_oss.to_model(hf, set())


def quantize(folder: Path) -> dict[str, torch.Tensor]:
    """The folder's expert weights replaced by random MXFP4 blocks and scales in the published
    layout (`<name>_blocks` [experts, out, in / 32, 16], `<name>_scales` [experts, out, in / 32]),
    config.json marked mxfp4; returns what transformers' own dequantization makes of them."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    tensors = load_file(folder / "model.safetensors")
    generator = torch.Generator().manual_seed(3)
    expected = {}
    for name in [n for n in tensors if n.endswith(("gate_up_proj", "down_proj"))]:
        experts, inputs, outputs = tensors.pop(name).shape
        groups = inputs // 32
        blocks = torch.randint(0, 256, (experts, outputs, groups, 16), generator=generator)
        scales = torch.randint(
            118, 124, (experts, outputs, groups), generator=generator
        )  # x 2^-9..2^-4
        tensors[f"{name}_blocks"] = blocks.to(torch.uint8)
        tensors[f"{name}_scales"] = scales.to(torch.uint8)
        expected[name] = convert_moe_packed_tensors(
            tensors[f"{name}_blocks"], tensors[f"{name}_scales"], dtype=torch.bfloat16
        )
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (folder / "config.json").write_text(json.dumps(config))
    return expected


def test_mxfp4_dequantizes_as_transformers_does() -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from models.hf.mapping import dequantize_mxfp4

    generator = torch.Generator().manual_seed(4)
    blocks = torch.randint(0, 256, (3, 5, 4, 16), generator=generator).to(torch.uint8)
    scales = torch.randint(100, 150, (3, 5, 4), generator=generator).to(torch.uint8)
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16)  # [3, in, out]
    ours = dequantize_mxfp4(blocks, scales)  # [3, out, in]
    assert torch.equal(ours.transpose(1, 2), theirs)


def mxfp4_folder(folder: Path) -> torch.nn.Module:
    """A tiny model in the published MXFP4 layout (hidden and FFN widths multiples of 32) and
    transformers' model loaded from it (on a CPU it dequantizes the experts)."""
    save(tiny_config(intermediate_size=32, hidden_size=64), folder)
    quantize(folder)
    return transformers.GptOssForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def test_mxfp4_folder_logits_match_transformers(tmp_path: Path) -> None:
    reference = mxfp4_folder(tmp_path / "hf")
    assert_logits_match(reference, tmp_path / "hf", tmp_path / "run")


def test_mxfp4_import_exports_a_dequantized_folder_transformers_loads(tmp_path: Path) -> None:
    """An MXFP4 folder imported, then exported: the experts come back dequantized (BF16), the
    other tensors bit for bit, and config.json without its quantization_config."""
    from recipes.cli import main
    from training.hf.convert import iter_tensors

    reference = mxfp4_folder(tmp_path / "hf")
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
    assert main(["export", str(tmp_path / "imported"), str(tmp_path / "back")]) == 0
    original, back = dict(iter_tensors(tmp_path / "hf")), dict(iter_tensors(tmp_path / "back"))
    dequantized = {n: p for n, p in reference.state_dict().items() if n.endswith("_proj")}
    quantized = {n for n in original if n.endswith(("_proj_blocks", "_proj_scales"))}
    assert sorted(back) == sorted(set(original) - quantized | set(dequantized))
    assert "quantization_config" not in json.loads((tmp_path / "back" / "config.json").read_text())
    for name, value in back.items():
        want = original.get(name, dequantized.get(name))
        assert torch.equal(value.float(), want.float()), name
    exported = transformers.GptOssForCausalLM.from_pretrained(
        tmp_path / "back", dtype=torch.float32
    )
    with torch.no_grad():
        torch.testing.assert_close(
            exported(TOKENS).logits, reference(TOKENS).logits, rtol=0, atol=0
        )


def test_import_then_export_gives_every_tensor_back_bit_for_bit(tmp_path: Path) -> None:
    from recipes.cli import main
    from training.hf.convert import iter_tensors

    reference = save(tiny_config(), tmp_path / "hf")
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
    assert_logits_match(reference, tmp_path / "hf", tmp_path / "run", tmp_path / "imported")
    assert main(["export", str(tmp_path / "imported"), str(tmp_path / "back")]) == 0
    original, back = dict(iter_tensors(tmp_path / "hf")), dict(iter_tensors(tmp_path / "back"))
    assert sorted(back) == sorted(original)
    for name, value in original.items():
        assert torch.equal(back[name], value), name


# --- the presets against the published config.json --------------------------------------------
# openai/gpt-oss-20b's config.json on the Hugging Face hub (transformers 4.55 format), the fields
# that shape the model; openai/gpt-oss-120b's differs in num_hidden_layers (36), num_local_experts
# (128) and layer_types (36 entries).
GPT_OSS_20B_CONFIG: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 200002,
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "initial_context_length": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072,
    "model_type": "gpt_oss",
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "output_router_logits": False,
    "pad_token_id": 199999,
    "quantization_config": {
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
        "quant_method": "mxfp4",
    },
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": 201088,
}
GPT_OSS_120B_CONFIG = GPT_OSS_20B_CONFIG | {
    "num_hidden_layers": 36,
    "num_local_experts": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
}


# The gpt-oss model card's parameter table (billions): total, and active per token, which counts
# the unembedding but not the input embedding (0.58B each).
@pytest.mark.parametrize(
    "name, published, layers, experts, billions, active",
    [
        ("gpt_oss_20b", GPT_OSS_20B_CONFIG, 24, 32, 20.91, 3.61),
        ("gpt_oss_120b", GPT_OSS_120B_CONFIG, 36, 128, 116.83, 5.13),
    ],
)
def test_presets_have_the_published_numbers(
    name: str, published: dict[str, Any], layers: int, experts: int, billions: float, active: float
) -> None:
    from config.cost.memory import count_parameters
    from config.hf import ARCH_FIELDS
    from config.schema import TrainConfig, TrainingConfig
    from models.hf import gpt_oss
    from models.presets import gpt_oss as presets

    m = getattr(presets, name)()
    assert (m.num_layers, m.num_moe_experts, m.moe_router_topk) == (layers, experts, 4)
    assert (m.hidden_size, m.moe_ffn_hidden_size, m.vocab_size) == (2880, 2880, 201088)
    assert (m.num_attention_heads, m.num_query_groups, m.kv_channels) == (64, 8, 64)
    assert (m.window_size, m.window_attn_skip_freq, m.softmax_type) == (127, 2, "learnable")
    assert (m.rotary_base, m.rope_scaling, m.rope_scaling_factor) == (150000, "yarn", 32.0)
    assert m.rope_original_max_position_embeddings == 4096
    assert not m.rope_correction_range_round_to_int  # truncate false
    assert (m.activation_func_clamp_value, m.glu_linear_offset) == (7.0, 1.0)
    assert m.add_bias_linear and not m.share_embeddings_and_output_weights
    # The map reads the published config.json into the same architecture, field for field.
    theirs = gpt_oss.to_model(published, set())
    assert {f: getattr(m, f) for f in ARCH_FIELDS} == {f: getattr(theirs, f) for f in ARCH_FIELDS}
    train = TrainConfig(global_batch_size=1, micro_batch_size=1, max_steps=1)
    count = count_parameters(TrainingConfig(name=name, model=m, train=train))
    assert count.total / 1e9 == pytest.approx(billions, rel=0.005)
    assert (count.active_per_token - count.embedding) / 1e9 == pytest.approx(active, rel=0.01)


@pytest.mark.parametrize("name", ["gpt_oss_20b", "gpt_oss_120b"])
def test_config_json_written_without_an_origin_reads_back(name: str) -> None:
    """An export of a run that did not start from a folder writes `to_hf`'s config.json: transformers
    takes it (its config class is strict) with the published layer pattern, and the map reads it
    back into the same architecture."""
    from config.hf import ARCH_FIELDS
    from models.hf import gpt_oss
    from models.presets import gpt_oss as presets

    model = getattr(presets, name)()
    written = json.loads(json.dumps(gpt_oss.to_hf(model)))
    config = transformers.GptOssConfig(**written)
    published = GPT_OSS_20B_CONFIG if name == "gpt_oss_20b" else GPT_OSS_120B_CONFIG
    assert config.layer_types == published["layer_types"]
    assert config.sliding_window == 128 and config.rope_parameters["truncate"] is False
    back = gpt_oss.to_model(config.to_dict(), set())
    assert {f: getattr(back, f) for f in ARCH_FIELDS} == {f: getattr(model, f) for f in ARCH_FIELDS}


def published_folder(folder: Path) -> Path:
    """The published gpt-oss-20b folder as the checker reads it: its config.json (MXFP4 experts)
    and safetensors headers (one expert tensor's blocks and scales stand for them all)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(GPT_OSS_20B_CONFIG))
    experts = "model.layers.0.mlp.experts.gate_up_proj"
    tensors = {
        f"{experts}_blocks": torch.zeros(1, 1, 1, 16, dtype=torch.uint8),
        f"{experts}_scales": torch.zeros(1, 1, 1, dtype=torch.uint8),
    }
    save_file(tensors, folder / "model.safetensors")
    return folder


def test_the_recipes_take_the_published_folder(tmp_path: Path) -> None:
    """gpt_oss_20b_sft takes the published (MXFP4) folder as its pretrained_dir; a field that
    differs is named; `model=<folder>` on another recipe takes GPT-OSS's architecture and meets
    Megatron-Core's rule on expert biases (ETP 1), named with its fix."""
    from config.rules import validate
    from recipes.registry import resolve

    folder = published_folder(tmp_path / "gpt-oss-20b")
    recipe, cfg = resolve("gpt_oss_20b_sft", [f"checkpoint.pretrained_dir={folder}"])
    assert validate(cfg, recipe.cluster) == []
    recipe, cfg = resolve(
        "gpt_oss_20b_sft", [f"checkpoint.pretrained_dir={folder}", "model.window_size=128"]
    )
    [problem] = validate(cfg, recipe.cluster)
    assert problem.field == "model.window_size" and "has 127" in problem.message
    recipe, cfg = resolve(
        "qwen3_8b_sft", [f"model={folder}", f"checkpoint.pretrained_dir={folder}"]
    )
    assert cfg.model.softmax_type == "learnable" and cfg.model.num_moe_experts == 32
    fields = [p.field for p in validate(cfg, recipe.cluster)]
    assert fields == ["model.add_bias_linear"]  # ETP defaults to TP (4 in that recipe)
