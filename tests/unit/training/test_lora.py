"""LoRA on the engine, with peft and transformers as the oracle.

A tiny random Llama made on the spot is the base. The engine loads it, adapts its linear layers
(training/lora.py), trains a few steps and saves a checkpoint that holds the adapters alone. Then:
the base weights are bitwise the folder's, only the adapters moved, the loss fell; the adapter
exported in PEFT's layout and loaded by `peft` on the folder gives the engine's logits, and so
does the merged export in transformers. Multi-rank layouts (TP 2, PP 2) and exact resume are in
tests/smoke/test_lora_cpu.py; the checker's rules at the end here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from config.hardware import Cluster
from recipes.advice.check import check
from recipes.cli import main
from recipes.registry import resolve
from tests.support.hf_oracle import engine_from_hf, gpt_logits, hf_config
from tests.unit.training.test_engine import one_rank  # noqa: F401  (the module's one-rank process group)
from tests.unit.training.test_hf_roundtrip import checkpointer_for

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
RANK, ALPHA = 4, 8.0


def lora_config(folder: Path, run_dir: Path, targets: str) -> object:
    cfg = hf_config(folder, run_dir)
    cfg.peft.scheme, cfg.peft.rank, cfg.peft.alpha = "lora", RANK, ALPHA
    cfg.peft.target_modules = targets
    cfg.train.max_steps = 6
    cfg.scheduler.warmup_steps = 1
    cfg.optimizer.lr = 2e-2
    return cfg


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize("targets", ["linear_qkv,linear_proj,linear_fc1,linear_fc2", "linear_qkv"])
def test_lora_trains_adapters_only_and_exports_what_peft_computes(
    tmp_path: Path,
    targets: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tests.unit.models.test_hf_families import TOKENS
    from tests.unit.models.test_hf_llama import tiny_llama
    from training.checkpoint.state import model_chunks

    original = tiny_llama(tmp_path / "hf")
    cfg = lora_config(tmp_path / "hf", tmp_path / "run", targets)
    trainer = engine_from_hf(cfg, tmp_path / "run")
    try:
        chunk = model_chunks(trainer.model)["model"]
        base = {n: p.detach().clone() for n, p in chunk.named_parameters() if "lora_" not in n}
        adapters = [n for n, p in chunk.named_parameters() if p.requires_grad]
        assert adapters and all(n.rsplit(".", 1)[-1] in ("lora_A", "lora_B") for n in adapters)
        checkpointer = checkpointer_for(trainer, tmp_path / "run")
        trainer.train(hooks=[checkpointer])
        checkpointer.close()
        for name, param in chunk.named_parameters():
            if "lora_" not in name:
                assert torch.equal(param, base[name]), f"{name}: a frozen weight changed"
        assert all(chunk.get_parameter(n).abs().sum() > 0 for n in adapters if "lora_B" in n)
        ours = gpt_logits(trainer, TOKENS)
    finally:
        trainer.close()
    losses = [
        json.loads(line)["loss"]
        for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()
    ]
    assert losses[-1] < losses[0]

    # The checkpoint holds the adapters (and the optimizer's state of them), not the base.
    from torch.distributed.checkpoint import FileSystemReader

    saved = FileSystemReader(str(tmp_path / "run/checkpoints/iter_0000006")).read_metadata()
    model_keys = [k for k in saved.state_dict_metadata if not k.startswith(("optimizer", "common"))]
    assert model_keys and all(k.rsplit(".", 1)[-1] in ("lora_A", "lora_B") for k in model_keys)

    ckpt = str(tmp_path / "run" / "checkpoints")
    assert main(["export", ckpt, str(tmp_path / "adapter"), "--adapter"]) == 0
    assert main(["export", ckpt, str(tmp_path / "merged")]) == 0
    config = json.loads((tmp_path / "adapter/adapter_config.json").read_text())
    assert config["r"] == RANK and config["lora_alpha"] == ALPHA
    base_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    adapted = peft.PeftModel.from_pretrained(base_model, tmp_path / "adapter").eval()
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        theirs, merged_logits = adapted(TOKENS).logits, merged(TOKENS).logits
        before = original(TOKENS).logits
    assert (theirs - before).abs().max() > 1e-3  # the adapters moved the model
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(merged_logits, theirs, rtol=1e-5, atol=1e-5)

    # The merged export copies the origin's files: one that links to a private file is refused.
    secret = tmp_path / "secret.json"
    secret.write_text('{"token": "hf_SECRET"}')
    (tmp_path / "hf" / "generation_config.json").unlink()
    (tmp_path / "hf" / "generation_config.json").symlink_to(secret)
    assert main(["export", ckpt, str(tmp_path / "merged2")]) == 2
    assert not (tmp_path / "merged2").exists()

    # A full disk as safetensors reports it (its Rust writer's io error, in words).
    from safetensors import SafetensorError

    def full(*args: object, **kwargs: object) -> None:
        raise SafetensorError(
            "Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
            'message: "No space left on device" })'
        )

    monkeypatch.setattr("training.hf.lora_export.save_file", full)
    assert main(["export", ckpt, str(tmp_path / "adapter2"), "--adapter"]) == 2
    assert f"No space left on device writing {tmp_path / 'adapter2'}" in capsys.readouterr().err
    assert not (tmp_path / "adapter2").exists()


def test_export_of_a_full_checkpoint_refuses_adapter(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    assert main(["export", str(tmp_path / "nothing"), str(tmp_path / "out"), "--adapter"]) == 2


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["peft.target_modules=linear_qkv,q_proj"], "peft.target_modules"),
        (["peft.target_modules="], "peft.target_modules"),
        (["precision=bf16_with_fp8_current_scaling_mixed"], "precision"),
        (["parallel.context_parallel_size=2"], "parallel.context_parallel_size"),
        (["peft.rank=8192"], "peft.rank"),
    ],
)
def test_check_refuses_what_lora_cannot_run(overrides: list[str], field: str) -> None:
    _, cfg = resolve("llama3_8b_pretrain", ["peft.scheme=lora", *overrides])
    report = check(cfg, Cluster(1, 8, "h100"))
    assert field in [p.field for p in report.problems], report.problems


def test_check_knows_an_architecture_without_dense_mlps() -> None:
    _, cfg = resolve("qwen3_30b_a3b_pretrain", ["peft.scheme=lora"])
    report = check(cfg, Cluster(2, 8, "h100"))
    messages = [p.message for p in report.problems if p.field == "peft.target_modules"]
    assert messages and "experts are not adapted" in messages[0]
    _, cfg = resolve(
        "qwen3_30b_a3b_pretrain", ["peft.scheme=lora", "peft.target_modules=linear_qkv,linear_proj"]
    )
    assert check(cfg, Cluster(2, 8, "h100")).valid
