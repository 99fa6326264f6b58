"""Gemma 3 across ranks, fine-tuned, exported, and read back by transformers and peft.

The base is the tiny random Gemma3ForCausalLM of tests/unit/models/test_hf_gemma3.py (six layers,
a global one every third, a 4-token window over 32, its own RoPE base on the local layers, every
norm randomised), whose one-rank logits match transformers' to 1e-5. Here it trains 6 steps on
Megatron's mock data (counting sequences) in FP32 on 2 CPU processes: full fine-tuning and LoRA,
each at DP 2 (the reference), TP 2 with sequence parallel (QKV, fc1 and the post norms on sequence
shards, their gradients summed over TP) and PP 2 (three layers a stage: local, local, global).
Step 1's loss is the loaded model's on the same batch, so layouts that agree there compute the
same logits; a wrong slice, a local layer taken for a global one or a missing reduction would
part the losses within the 6 steps.

Then: the full fine-tune exported (`recipes export`) loads in transformers and predicts a counting
sequence better than the folder it started from (the loss fell, in transformers); each LoRA
layout's adapter, exported in peft's layout, loads on the folder in peft and gives the logits of
its merged export. The same holds for LoRA on the language model of a Gemma3ForConditionalGeneration
folder (the 4B-27B's class), whose merged export keeps the vision tower bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from config.tree import write_yaml
from recipes.cli import main
from tests.smoke.conftest import _env, assert_same_training
from tests.smoke.run_many import launch_many
from tests.support.hf_oracle import hf_config

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytestmark = pytest.mark.smoke

LAYOUTS = {
    "dp2": {},
    "tp2_sp": {"tensor_model_parallel_size": 2, "sequence_parallel": True},
    "pp2": {"pipeline_model_parallel_size": 2},
}
STEPS = 6


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]


def counting_loss(folder: Path) -> float:
    """transformers' loss on a counting sequence, the pattern of Megatron's mock data."""
    tokens = (torch.arange(32) + 7).unsqueeze(0) % 200
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return float(model(tokens, labels=tokens).loss)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.unit.models.test_hf_gemma3 import tiny_gemma3, tiny_gemma3_vlm

    root = tmp_path_factory.mktemp("gemma3")
    folder = root / "hf"
    tiny_gemma3(folder)
    configs, names = [], []
    for lora in (False, True):
        for layout, parallel in LAYOUTS.items():
            name = f"{'lora' if lora else 'full'}_{layout}"
            cfg = hf_config(folder, root / name, **parallel)
            cfg.name = name
            if lora:
                cfg.peft.scheme, cfg.peft.rank, cfg.peft.alpha = "lora", 4, 8.0
            cfg.train.max_steps, cfg.train.global_batch_size = STEPS, 4
            cfg.scheduler.warmup_steps = 1
            cfg.optimizer.lr = 2e-2 if lora else 3e-3
            configs.append(write_yaml(cfg, root / "configs" / f"{name}.yaml"))
            names.append(name)
    # LoRA on the language model of a vision-language folder (the 4B-27B's class), its vision
    # tower not loaded.
    tiny_gemma3_vlm(root / "vlm_parts")
    cfg = hf_config(root / "vlm_parts" / "vlm", root / "lora_vlm")
    cfg.name = "lora_vlm"
    cfg.peft.scheme, cfg.peft.rank, cfg.peft.alpha = "lora", 4, 8.0
    cfg.train.max_steps, cfg.train.global_batch_size = STEPS, 4
    cfg.scheduler.warmup_steps, cfg.optimizer.lr = 1, 2e-2
    configs.append(write_yaml(cfg, root / "configs" / "lora_vlm.yaml"))
    names.append("lora_vlm")
    outcomes = launch_many(configs, 2, _env(root), root / "logs")
    for name in names:
        assert outcomes[name].error is None, outcomes[name].failure(name)
    return root


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_tp_sp_and_pp_train_as_data_parallel(runs: Path, kind: str) -> None:
    """Losses and gradient norms step by step. Measured: they agree to 1e-5 (TP sums in another
    order); with the post norms left unmarked for sequence parallel (their partial gradients not
    summed over TP), the gradient norm is 7e-4 off at step 1 and 1e-2 by step 5, while the losses
    still agree to 1e-5."""
    reference = records(runs / f"{kind}_dp2")
    for layout in ("tp2_sp", "pp2"):
        assert_same_training(records(runs / f"{kind}_{layout}"), reference, STEPS, rel=5e-5)


def test_full_fine_tune_exports_a_model_transformers_finds_better(runs: Path) -> None:
    before = counting_loss(runs / "hf")
    for layout in LAYOUTS:
        out = runs / "export" / f"full_{layout}"
        assert main(["export", str(runs / f"full_{layout}" / "checkpoints"), str(out)]) == 0
        after = counting_loss(out)
        assert after < before - 0.1, (layout, before, after)


def test_lora_adapters_load_in_peft_as_their_merged_export(runs: Path) -> None:
    folder = runs / "hf"
    tokens = torch.randint(0, 200, (2, 32), generator=torch.Generator().manual_seed(0))
    base = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        before = base(tokens).logits
    for layout in LAYOUTS:
        ckpt = str(runs / f"lora_{layout}" / "checkpoints")
        adapter, merged = runs / "export" / f"lora_{layout}_adapter", runs / "export" / layout
        assert main(["export", ckpt, str(adapter), "--adapter"]) == 0
        assert main(["export", ckpt, str(merged)]) == 0
        model = peft.PeftModel.from_pretrained(
            transformers.AutoModelForCausalLM.from_pretrained(folder), adapter
        ).eval()
        merged_model = transformers.AutoModelForCausalLM.from_pretrained(merged).eval()
        with torch.no_grad():
            theirs, merged_logits = model(tokens).logits, merged_model(tokens).logits
        assert (theirs - before).abs().max() > 1e-3, layout  # the adapters moved the model
        torch.testing.assert_close(merged_logits, theirs, rtol=1e-5, atol=1e-5)


def test_lora_on_the_language_model_of_a_vision_language_folder(runs: Path) -> None:
    """The adapter loads in peft on Gemma3ForConditionalGeneration and gives the logits of the
    merged export, which holds the folder's vision tower unchanged."""
    from training.hf.convert import iter_tensors

    folder, ckpt = runs / "vlm_parts" / "vlm", str(runs / "lora_vlm" / "checkpoints")
    adapter, merged = runs / "export" / "lora_vlm_adapter", runs / "export" / "lora_vlm"
    assert main(["export", ckpt, str(adapter), "--adapter"]) == 0
    assert main(["export", ckpt, str(merged)]) == 0
    original, exported = dict(iter_tensors(folder)), dict(iter_tensors(merged))
    assert sorted(exported) == sorted(original)
    vision = [n for n in original if n.startswith(("vision_tower.", "multi_modal_projector."))]
    assert vision and all(torch.equal(exported[n], original[n]) for n in vision)
    tokens = torch.randint(0, 200, (2, 32), generator=torch.Generator().manual_seed(0))
    vlm = transformers.Gemma3ForConditionalGeneration
    with torch.no_grad():
        before = vlm.from_pretrained(folder).eval()(tokens).logits
        theirs = (
            peft.PeftModel.from_pretrained(vlm.from_pretrained(folder), adapter)
            .eval()(tokens)
            .logits
        )
        merged_logits = vlm.from_pretrained(merged).eval()(tokens).logits
    assert (theirs - before).abs().max() > 1e-3  # the adapters moved the model
    torch.testing.assert_close(merged_logits, theirs, rtol=1e-5, atol=1e-5)
