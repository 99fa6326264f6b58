"""GPT-OSS trained on two CPU ranks from a Hugging Face folder, and read back by transformers and peft.

A tiny random GptOssForCausalLM (tests/unit/models/test_hf_gpt_oss.py: a windowed and a full layer,
sinks, biased experts and router, YaRN) is the base, in FP32 so that layouts agree to rounding.

- LoRA on the attention (the experts are not adapted) trains the same adapters at DP 2 and at EP 2;
  each exported adapter loads on the folder in peft and gives the logits of its merged export.
- The folder's logits at EP 2 and at TP 2 (with SP; the experts whole, ETP 1: their biases) are
  transformers' (tests/smoke/hf_logits.py under torchrun).
- A full fine-tune at EP 2 on Megatron-Core's mock data (counting sequences: 1, 2, 3, ... then
  EOD) exports a folder that transformers loads, and transformers' own loss on counting
  sequences falls from the folder's to the export's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from config.tree import write_yaml
from recipes.cli import main
from tests.smoke.conftest import _env
from tests.smoke.run_many import launch_many
from tests.support import children
from tests.support.hf_oracle import hf_config

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytestmark = pytest.mark.smoke

STEPS = 6
VOCAB = 200


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").open()]


def folder_of(tmp_path: Path) -> Path:
    from tests.unit.models.test_hf_gpt_oss import save, tiny_config

    save(tiny_config(swiglu_limit=7.0), tmp_path / "hf")  # the published clamp
    return tmp_path / "hf"


def counting(rows: int = 4, length: int = 32) -> torch.Tensor:
    """Rows like the mock data's: consecutive token ids from several starts."""
    starts = torch.arange(rows).unsqueeze(1) * 7 + 1
    return (starts + torch.arange(length)) % VOCAB


def lm_loss(folder: Path, tokens: torch.Tensor) -> float:
    model = transformers.GptOssForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return float(model(tokens, labels=tokens).loss)


@pytest.mark.parametrize(
    "parallel",
    [
        {"expert_model_parallel_size": 2},
        {
            "tensor_model_parallel_size": 2,
            "sequence_parallel": True,
            "expert_tensor_parallel_size": 1,
        },
    ],
    ids=["ep2", "tp2_sp"],
)
def test_two_rank_logits_match_transformers(tmp_path: Path, parallel: dict) -> None:
    from tests.unit.models.test_hf_gpt_oss import TOKENS, save, tiny_config

    reference = save(tiny_config(), tmp_path / "hf")
    cfg = hf_config(tmp_path / "hf", tmp_path / "run", **parallel)
    config = write_yaml(cfg, tmp_path / "cfg.yaml")
    torch.save(TOKENS, tmp_path / "tokens.pt")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "tests.smoke.hf_logits", "--config", str(config)]
    cmd += ["--tokens", str(tmp_path / "tokens.pt"), "--out", str(tmp_path / "logits.pt")]
    done = children.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with torch.no_grad():
        theirs = reference(TOKENS).logits
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), theirs, rtol=1e-5, atol=1e-5)


def test_lora_on_dp2_and_ep2_exports_what_peft_computes(tmp_path: Path) -> None:
    folder = folder_of(tmp_path)
    layouts = {"dp2": {}, "ep2": {"expert_model_parallel_size": 2}}
    configs = []
    for name, parallel in layouts.items():
        cfg = hf_config(folder, tmp_path / name, **parallel)
        cfg.name = name
        cfg.peft.scheme, cfg.peft.rank, cfg.peft.alpha = "lora", 4, 8.0
        cfg.peft.target_modules = "linear_qkv,linear_proj"  # every MLP is a routed expert
        cfg.train.max_steps, cfg.train.global_batch_size = STEPS, 4
        cfg.scheduler.warmup_steps = 1
        cfg.optimizer.lr = 2e-2
        configs.append(write_yaml(cfg, tmp_path / "configs" / f"{name}.yaml"))
    outcomes = launch_many(configs, 2, _env(tmp_path), tmp_path / "logs")
    for name in layouts:
        assert outcomes[name].error is None, outcomes[name].failure(name)
    reference = losses(tmp_path / "dp2")
    assert reference[-1] < reference[0]
    assert losses(tmp_path / "ep2") == pytest.approx(reference, rel=1e-4)

    tokens = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    base = transformers.GptOssForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        before = base(tokens).logits
    for name in layouts:
        ckpt = str(tmp_path / name / "checkpoints")
        adapter, merged = tmp_path / "export" / f"{name}_adapter", tmp_path / "export" / name
        assert main(["export", ckpt, str(adapter), "--adapter"]) == 0
        assert main(["export", ckpt, str(merged)]) == 0
        model = peft.PeftModel.from_pretrained(
            transformers.GptOssForCausalLM.from_pretrained(folder), adapter
        ).eval()
        merged_model = transformers.GptOssForCausalLM.from_pretrained(merged).eval()
        with torch.no_grad():
            theirs, merged_logits = model(tokens).logits, merged_model(tokens).logits
        assert (theirs - before).abs().max() > 1e-3, name  # the adapters moved the model
        torch.testing.assert_close(merged_logits, theirs, rtol=1e-5, atol=1e-5)


def test_fine_tune_at_ep2_exports_a_folder_whose_loss_fell_in_transformers(
    tmp_path: Path,
) -> None:
    folder = folder_of(tmp_path)
    cfg = hf_config(folder, tmp_path / "ft", expert_model_parallel_size=2)
    cfg.name = "ft"
    cfg.train.max_steps, cfg.train.global_batch_size = 12, 4
    cfg.scheduler.warmup_steps = 1
    cfg.optimizer.lr = 1e-2
    outcomes = launch_many(
        [write_yaml(cfg, tmp_path / "configs" / "ft.yaml")], 2, _env(tmp_path), tmp_path / "logs"
    )
    assert outcomes["ft"].error is None, outcomes["ft"].failure("ft")
    trained = losses(tmp_path / "ft")
    assert trained[-1] < trained[0]
    out = tmp_path / "export"
    assert main(["export", str(tmp_path / "ft" / "checkpoints"), str(out)]) == 0
    tokens = counting()
    before, after = lm_loss(folder, tokens), lm_loss(out, tokens)
    assert after < 0.9 * before, (before, after)
