"""LoRA across ranks: TP 2, PP 2 and PP 2 x VPP 2 train the same adapters as one data-parallel
layout, and their exports are what peft computes.

A tiny Llama folder made here is the base (fp32, so layouts agree to rounding). The same LoRA run
trains on mock data at DP 2 (the reference), TP 2 (column- and row-parallel adapters, the TP sum
of the whole factors' gradients, training/lora.py), PP 2 and the interleaved PP 2 x VPP 2; a missing reduction or a wrong slice
would make the losses part within a few steps. Each layout's adapter, exported in peft's layout,
loads on the folder in peft and gives the logits of its merged export. Exact resume of LoRA runs
is tests/smoke/test_checkpoint.py (layouts lora_tp2, lora_pp2).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from config.tree import write_yaml
from recipes.cli import main
from tests.smoke.conftest import _env
from tests.smoke.run_many import launch_many
from tests.smoke.test_hf_layouts import llama
from tests.support.hf_oracle import hf_config

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytestmark = pytest.mark.smoke

LAYOUTS = {
    "dp2": {},
    "tp2": {"tensor_model_parallel_size": 2},
    "pp2": {"pipeline_model_parallel_size": 2},
    "pp2_vpp2": {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2},
}
STEPS = 6


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").open()]


def test_tp_and_pp_train_the_same_adapters_and_export_what_peft_computes(tmp_path: Path) -> None:
    folder = llama(tmp_path / "hf")
    configs = []
    for name, parallel in LAYOUTS.items():
        cfg = hf_config(folder, tmp_path / name, **parallel)
        cfg.name = name
        cfg.peft.scheme, cfg.peft.rank, cfg.peft.alpha = "lora", 4, 8.0
        cfg.train.max_steps, cfg.train.global_batch_size = STEPS, 4
        cfg.scheduler.warmup_steps = 1
        cfg.optimizer.lr = 2e-2
        configs.append(write_yaml(cfg, tmp_path / "configs" / f"{name}.yaml"))
    outcomes = launch_many(configs, 2, _env(tmp_path), tmp_path / "logs")
    for name in LAYOUTS:
        assert outcomes[name].error is None, outcomes[name].failure(name)
    reference = losses(tmp_path / "dp2")
    assert reference[-1] < reference[0]
    for name in ("tp2", "pp2", "pp2_vpp2"):
        assert losses(tmp_path / name) == pytest.approx(reference, rel=1e-4), name

    tokens = torch.randint(0, 200, (2, 16), generator=torch.Generator().manual_seed(0))
    base = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        before = base(tokens).logits
    for name in LAYOUTS:
        ckpt = str(tmp_path / name / "checkpoints")
        adapter, merged = tmp_path / "export" / f"{name}_adapter", tmp_path / "export" / name
        assert main(["export", ckpt, str(adapter), "--adapter"]) == 0
        assert main(["export", ckpt, str(merged)]) == 0
        model = peft.PeftModel.from_pretrained(
            transformers.AutoModelForCausalLM.from_pretrained(folder), adapter
        ).eval()
        merged_model = transformers.AutoModelForCausalLM.from_pretrained(merged).eval()
        with torch.no_grad():
            theirs, merged_logits = model(tokens).logits, merged_model(tokens).logits
        assert (theirs - before).abs().max() > 1e-3, name  # the adapters moved the model
        torch.testing.assert_close(merged_logits, theirs, rtol=1e-5, atol=1e-5)
