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
from config.rules import derive
from recipes.advice.check import check
from recipes.cli import main
from recipes.registry import resolve
from tests.support.hf_oracle import engine_from_hf, gpt_logits, hf_config
from tests.unit.training.test_engine import (
    checkpointer_for,
    one_rank,  # noqa: F401  (the module's one-rank process group)
)

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

    # A base changed in place since the run (one weight rescaled: same names, shapes and size)
    # would merge without a word: the export compares it with the run's record and refuses it.
    from safetensors.torch import load_file, save_file

    weights = tmp_path / "hf" / "model.safetensors"
    kept = weights.read_bytes()
    tensors = load_file(str(weights))
    name = next(n for n in sorted(tensors) if n.endswith("q_proj.weight"))
    tensors[name] = tensors[name] * 2
    save_file(tensors, str(weights), metadata={"format": "pt"})
    assert weights.stat().st_size == len(kept)
    assert main(["export", ckpt, str(tmp_path / "merged3")]) == 2
    err = capsys.readouterr().err
    assert "is not the base the LoRA adapters" in err and "model.safetensors" in err, err
    assert not (tmp_path / "merged3").exists()
    assert main(["export", ckpt, str(tmp_path / "adapter3"), "--adapter"]) == 0  # needs no base
    weights.write_bytes(kept)

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


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize(
    "family, modules",
    [
        ("qwen2", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}),
        ("mistral", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}),
        # Phi-3's fused layers: one adapter each, B's rows in qkv_proj's [q; k; v] order
        ("phi3", {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}),
    ],
)
def test_lora_of_each_family_exports_what_peft_computes(
    tmp_path: Path, family: str, modules: set[str]
) -> None:
    """Every linear layer adapted on a tiny model of the family, a few steps (the loss falls); the
    adapter, exported under peft's module names, loaded by peft on the folder gives the engine's
    logits, and so does the merged export in transformers."""
    from tests.unit.models.test_hf_families import TOKENS, tiny

    tiny(family, tmp_path / "hf")
    targets = "linear_qkv,linear_proj,linear_fc1,linear_fc2"
    cfg = lora_config(tmp_path / "hf", tmp_path / "run", targets)
    trainer = engine_from_hf(cfg, tmp_path / "run")
    try:
        checkpointer = checkpointer_for(trainer, tmp_path / "run")
        trainer.train(hooks=[checkpointer])
        checkpointer.close()
        ours = gpt_logits(trainer, TOKENS)
    finally:
        trainer.close()
    metrics = (tmp_path / "run/metrics.jsonl").read_text().splitlines()
    losses = [json.loads(line)["loss"] for line in metrics]
    assert losses[-1] < losses[0]
    ckpt = str(tmp_path / "run" / "checkpoints")
    assert main(["export", ckpt, str(tmp_path / "adapter"), "--adapter"]) == 0
    assert main(["export", ckpt, str(tmp_path / "merged")]) == 0
    config = json.loads((tmp_path / "adapter/adapter_config.json").read_text())
    assert set(config["target_modules"]) == modules
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        before = base(TOKENS).logits
    adapted = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        theirs, merged_logits = adapted(TOKENS).logits, merged(TOKENS).logits
    assert (theirs - before).abs().max() > 1e-3  # the adapters moved the model
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(merged_logits, theirs, rtol=1e-5, atol=1e-5)


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


# --- a LoRA run resumes on the base it was trained on, and on no other ----------------------------
def lora_run(base: Path, run_dir: Path, steps: int) -> object:
    """A LoRA run on `base` (a Hugging Face folder or a checkpoint) to `steps`, saving at the end;
    its config."""
    from tests.unit.models.test_hf_llama import tiny_llama

    if not (run_dir.parent / "made").exists():
        tiny_llama(run_dir.parent / "made")  # the architecture of every base here
    cfg = lora_config(run_dir.parent / "made", run_dir, "linear_qkv,linear_fc2")
    cfg.checkpoint.pretrained_dir = str(base)
    cfg.train.max_steps = steps
    cfg.precision = "bf16_mixed"  # the distributed optimizer reloads FP32 params only as copies
    resumed(cfg, run_dir, train=True)
    return cfg


def resumed(cfg: object, run_dir: Path, train: bool = False) -> None:
    """A Trainer of `cfg`, resumed (or started) by a Checkpointer as `training.pretrain` does;
    trained to its end and saved when `train`; closed however it ends."""
    from training.engine import Trainer

    trainer = Trainer(cfg, derive(cfg, Cluster(1, 1, "cpu")), "cpu", run_dir)
    try:
        checkpointer = checkpointer_for(trainer, run_dir)
        try:
            checkpointer.resume()
            if train:
                trainer.train(hooks=[checkpointer])
        finally:
            checkpointer.close()
    finally:
        trainer.close()


def changed(folder: Path, change: str) -> None:
    """The base changed in place: one weight scaled, every weight another model's (the same names
    and shapes), or config.json rewritten."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    if change == "one weight scaled":
        tensors["model.layers.1.mlp.down_proj.weight"] *= 1.5
    elif change == "another model's weights":
        generator = torch.Generator().manual_seed(7)
        tensors = {k: 0.02 * torch.randn(v.shape, generator=generator) for k, v in tensors.items()}
    else:
        hf = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(hf | {"initializer_range": 0.05}))
        return
    save_file(tensors, path, metadata={"format": "pt"})


@pytest.mark.usefixtures("one_rank")
@pytest.mark.parametrize(
    "change", ["one weight scaled", "another model's weights", "config.json rewritten"]
)
def test_lora_does_not_resume_on_a_changed_hugging_face_base(
    tmp_path: Path, change: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint records the base's files; a resume on a base changed in place is refused,
    naming the file that differs, before anything is loaded. The launcher refuses before launch,
    with the same message, what it can tell without reading big weight files: all of it for these
    small ones; of a base whose weights are big, only a changed config.json. The unchanged base
    resumes."""
    from config.tree import ConfigError
    from launchers.resume import check_resume
    from tests.unit.models.test_hf_llama import tiny_llama
    from training.checkpoint import lora_base

    tiny_llama(tmp_path / "base")
    cfg = lora_run(tmp_path / "base", tmp_path / "run", steps=2)
    cfg.train.max_steps = 3
    check_resume(cfg, tmp_path / "run")
    resumed(cfg, tmp_path / "run")  # the unchanged base

    changed(tmp_path / "base", change)
    with pytest.raises(ConfigError) as on_the_ranks:
        resumed(cfg, tmp_path / "run")
    problems = dict(on_the_ranks.value.problems)
    file = "config.json" if change == "config.json rewritten" else "model.safetensors"
    assert list(problems) == ["checkpoint.pretrained_dir"]
    message = problems["checkpoint.pretrained_dir"]
    assert f"{tmp_path / 'base'} is not the base" in message
    assert f"1 of its files differs: {file} (" in message
    with pytest.raises(ConfigError) as before_launch:
        check_resume(cfg, tmp_path / "run")
    assert dict(before_launch.value.problems) == problems
    weights = (tmp_path / "base" / "model.safetensors").stat().st_size
    monkeypatch.setattr(lora_base, "SMALL", weights - 1)  # as if the weights were big
    if file == "config.json":
        with pytest.raises(ConfigError) as before_launch:
            check_resume(cfg, tmp_path / "run")
        assert dict(before_launch.value.problems) == problems
    else:  # the same names, shapes and size: only the ranks, which hash the weights, can tell
        check_resume(cfg, tmp_path / "run")


@pytest.mark.usefixtures("one_rank")
def test_lora_does_not_resume_on_another_import_in_the_base_folder(tmp_path: Path) -> None:
    """A base imported with `recipes import`: its manifest is the record (hashed once, at import).
    Another folder imported in its place is refused before launch and on the ranks alike."""
    import shutil

    from config.tree import ConfigError
    from launchers.resume import check_resume
    from tests.unit.models.test_hf_llama import tiny_llama

    tiny_llama(tmp_path / "hf")
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
    cfg = lora_run(tmp_path / "imported", tmp_path / "run", steps=2)
    cfg.train.max_steps = 3
    check_resume(cfg, tmp_path / "run")

    changed(tmp_path / "hf", "one weight scaled")
    shutil.rmtree(tmp_path / "imported")
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
    with pytest.raises(ConfigError) as before_launch:
        check_resume(cfg, tmp_path / "run")
    with pytest.raises(ConfigError) as on_the_ranks:
        resumed(cfg, tmp_path / "run")
    problems = dict(on_the_ranks.value.problems)
    assert dict(before_launch.value.problems) == problems
    message = problems["checkpoint.pretrained_dir"]
    assert f"{tmp_path / 'imported' / 'iter_0000000'} is not the base" in message
    assert "__0_0.distcp (" in message
