"""FP8 weights alone (Transformer Engine's FP8 parameters): NeMo's and Megatron-Bridge's presets of
delayed, current scaling and MXFP8 set fp8_param_gather (their mixed_precision.py), so a run keeps
the decoder's weights in FP8 only and the distributed optimizer all-gathers them as FP8; MXFP8's
gather reuses the gradient buffer. One answer, config/backend.py `fp8_weights`, for the engine's
TransformerConfig (fp8_param) and DDP config (fp8_param_gather) and for the memory estimate."""

from __future__ import annotations

from unittest import mock

import pytest

from config.backend import fp8_weights
from config.cost.memory import count_parameters, estimate_memory, fp8_weight_bytes
from config.hardware import Cluster
from config.precision import PRESETS
from config.rules import derive
from config.tree import apply_overrides
from tests.unit.config.test_validation import H100x8, llama_like

# Megatron-Bridge's src/megatron/bridge/training/mixed_precision.py and NeMo's
# nemo/collections/llm/recipes/precision/mixed_precision.py: fp8_param_gather per preset.
SOURCES = {
    "bf16_with_fp8_delayed_scaling_mixed": True,
    "bf16_with_fp8_current_scaling_mixed": True,
    "bf16_with_mxfp8_mixed": True,
    "bf16_with_fp8_subchannel_scaling_mixed": False,
    "bf16_with_nvfp4_mixed": False,
    "bf16_mixed": False,
}
DIST_OFF = "optimizer.use_distributed_optimizer=false"
B200x8 = Cluster(num_nodes=1, gpus_per_node=8, gpu="b200")  # every preset's tensor cores


def _cfg(precision: str, *overrides: str):
    return apply_overrides(llama_like(), [f"precision={precision}", *overrides])


@pytest.mark.parametrize(("name", "fp8"), SOURCES.items(), ids=list(SOURCES))
def test_the_presets_keep_fp8_weights_as_nemo_and_megatron_bridge_do(name: str, fp8: bool) -> None:
    assert PRESETS[name].fp8_param_gather is fp8
    assert PRESETS[name.replace("bf16", "fp16", 1)].fp8_param_gather is fp8
    assert fp8_weights(_cfg(name), PRESETS[name]) is fp8
    assert not fp8_weights(_cfg(name, DIST_OFF), PRESETS[name])  # no FP8 all-gather to keep
    assert not fp8_weights(_cfg(name, "parallel.use_megatron_fsdp=true"), PRESETS[name])
    assert not fp8_weights(_cfg(name, "checkpoint.pretrained_dir=/models/x"), PRESETS[name])


@pytest.mark.parametrize("name", list(SOURCES), ids=list(SOURCES))
def test_the_engine_builds_what_fp8_weights_says(name: str) -> None:
    """Megatron-Core's own configs as the engine builds them (Transformer Engine taken to import,
    as in a GPU container): TransformerConfig.fp8_param, and DistributedDataParallelConfig, whose
    constructor refuses the gradient-buffer reuse without fp8_param_gather."""
    torch = pytest.importorskip("torch")
    from models import gpt, specs
    from training.build import ddp_config

    cfg = _cfg(name)
    derived = derive(cfg, B200x8)
    fp8 = fp8_weights(cfg, derived.preset)
    with (
        mock.patch.object(specs, "have_transformer_engine", lambda: True),
        mock.patch.object(gpt, "have_transformer_engine", lambda: True),
    ):
        config = gpt.transformer_config(cfg, derived, "cuda", torch.bfloat16)
    assert config.fp8_param is fp8
    ddp = ddp_config(cfg, derived)
    assert ddp.fp8_param_gather is fp8
    assert ddp.reuse_grad_buf_for_mxfp8_param_ag is (fp8 and "mxfp8" in name)


def test_fp8_weights_drop_the_bf16_copy_of_the_decoder() -> None:
    """Where FP8 weights stand alone the decoder's layers hold only TE's FP8 data (2 bytes a
    weight on Hopper, both directions); with BF16 weights kept, 2 more."""
    cfg = _cfg("bf16_with_fp8_current_scaling_mixed")
    kept = _cfg("bf16_with_fp8_current_scaling_mixed", DIST_OFF)
    alone = estimate_memory(cfg, H100x8, derive(cfg, H100x8))
    both = estimate_memory(kept, H100x8, derive(kept, H100x8))
    preset = PRESETS["bf16_with_fp8_current_scaling_mixed"]
    assert fp8_weight_bytes(preset, H100x8.spec) == 2.0
    m = cfg.model
    decoder = m.num_layers * count_parameters(cfg).dense_per_layer / 2  # TP 2 in llama_like
    assert (both.weights_gib - alone.weights_gib) * 2**30 == pytest.approx(2 * decoder, rel=1e-6)
