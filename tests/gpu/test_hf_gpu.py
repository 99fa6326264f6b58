"""A Hugging Face folder into the GPU model: Transformer Engine's layers where TE imports (its names
for the norms fused into linear layers), the SDPA spec otherwise.

The oracle of tests/smoke/test_hf_layouts.py on one GPU: a step at learning rate 0, the saved
checkpoint exported, every tensor equal to the folder's bit for bit (FP32 weights), and the export
loaded by transformers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from config.tree import write_yaml
from recipes.cli import main
from tests.smoke.conftest import _env
from tests.smoke.run_many import launch_many
from tests.smoke.test_hf_layouts import (
    assert_loaded_as_saved,
    deepseek_v3,
    llama,
    qwen3_5,
    qwen3_5_moe,
    qwen3_moe,
    tensors,
)
from tests.support.hf_oracle import hf_config

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("make", [llama, qwen3_moe, deepseek_v3], ids=lambda f: f.__name__)
def test_a_folder_loads_into_the_gpu_model_bit_for_bit(tmp_path: Path, make) -> None:  # noqa: ANN001
    folder = make(tmp_path / "hf")
    cfg = hf_config(folder, tmp_path / "run")
    cfg.name = "hf_gpu"
    cfg.train.device = "cuda"
    cfg.model.moe_token_dispatcher_type = "alltoall"  # the GPU's dispatcher
    cfg.scheduler.warmup_steps = 10  # step 1 at LR 0
    cfg.scheduler.decay_steps = 20
    config = write_yaml(cfg, tmp_path / "hf_gpu.yaml")
    outcome = launch_many([config], 1, _env(tmp_path), tmp_path / "logs")["hf_gpu"]
    assert outcome.error is None, outcome.failure("hf_gpu")
    out = tmp_path / "export"
    assert main(["export", str(tmp_path / "run" / "checkpoints"), str(out)]) == 0
    assert_loaded_as_saved(tensors(folder), tensors(out), make.__name__)
    transformers.AutoModelForCausalLM.from_pretrained(out)


@pytest.mark.parametrize("make", [qwen3_5, qwen3_5_moe], ids=lambda f: f.__name__)
def test_a_qwen3_5_folder_loads_into_the_gpu_model_bit_for_bit(tmp_path: Path, make) -> None:  # noqa: ANN001
    """Gated DeltaNet on the GPU: Megatron-Core's hybrid spec with Transformer Engine (its input
    norm fused into in_proj, the gated output norm kept plain) and fla's Triton kernels."""
    pytest.importorskip(
        "fla", reason="flash-linear-attention (Gated DeltaNet's kernels) is missing"
    )
    test_a_folder_loads_into_the_gpu_model_bit_for_bit(tmp_path, make)


def test_lora_on_one_gpu_trains_adapters_that_peft_loads(tmp_path: Path) -> None:
    """LoRA in BF16 on the GPU (the local layers and SDPA attention whatever TE is present):
    the loss falls and the exported adapter loads in peft on the folder."""
    peft = pytest.importorskip("peft")
    folder = llama(tmp_path / "hf")
    cfg = hf_config(folder, tmp_path / "run")
    cfg.name = "lora_gpu"
    cfg.train.device, cfg.precision = "cuda", "bf16_mixed"
    cfg.peft.scheme, cfg.peft.rank, cfg.peft.alpha = "lora", 4, 8.0
    cfg.train.max_steps, cfg.scheduler.warmup_steps, cfg.optimizer.lr = 8, 1, 2e-2
    config = write_yaml(cfg, tmp_path / "lora_gpu.yaml")
    outcome = launch_many([config], 1, _env(tmp_path), tmp_path / "logs")["lora_gpu"]
    assert outcome.error is None, outcome.failure("lora_gpu")
    import json

    losses = [
        json.loads(line)["loss"]
        for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()
    ]
    assert losses[-1] < losses[0]
    adapter = tmp_path / "adapter"
    assert main(["export", str(tmp_path / "run" / "checkpoints"), str(adapter), "--adapter"]) == 0
    peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(folder), adapter
    )
