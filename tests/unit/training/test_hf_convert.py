"""`recipes import` and `recipes export`: bit-for-bit round trips, the imported checkpoint as a
fine-tuning start, and a fine-tuned model that transformers loads with a lower loss.

transformers is the oracle: the folders are tiny random models it made and saved, and it reads
what `export` writes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from recipes.cli import main
from tests.support.full_disk import FULL_DISK, fills_up
from tests.support.hf_oracle import engine_from_hf, gpt_logits, hf_config
from tests.unit.models.test_hf_llama import tiny_llama
from tests.unit.training.test_engine import (  # noqa: F401 (one_rank: the module's process group)
    checkpointer_for,
    one_rank,
)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_rank")


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    from training.hf.convert import iter_tensors

    return dict(iter_tensors(folder))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_import_then_export_gives_every_tensor_back_bit_for_bit(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    model = tiny_llama(tmp_path / "made")
    model.to(dtype).save_pretrained(tmp_path / "hf")
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
    assert (tmp_path / "imported" / "latest").read_text().strip() == "iter_0000000"
    # Files of at most ~50 KB: several shards and their index, as save_pretrained shards.
    export = [
        "export",
        str(tmp_path / "imported"),
        str(tmp_path / "back"),
        "--max-shard-gb",
        "5e-5",
    ]
    assert main(export) == 0
    index = json.loads((tmp_path / "back" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    original, back = tensors(tmp_path / "hf"), tensors(tmp_path / "back")
    assert sorted(back) == sorted(original) == sorted(index["weight_map"])
    for name, value in original.items():
        assert back[name].dtype == value.dtype == dtype, name
        assert torch.equal(back[name], value), name
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back")
    assert reloaded.config.num_hidden_layers == 2


def test_an_imported_checkpoint_starts_a_run_with_the_folders_logits(tmp_path: Path) -> None:
    reference = tiny_llama(tmp_path / "hf")
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
    cfg = hf_config(tmp_path / "hf", tmp_path / "run")
    cfg.checkpoint.pretrained_dir = str(tmp_path / "imported")
    trainer = engine_from_hf(cfg, tmp_path / "run")
    try:
        tokens = torch.randint(0, 200, (2, 32), generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            theirs = reference(tokens).logits
        torch.testing.assert_close(gpt_logits(trainer, tokens), theirs, rtol=1e-5, atol=1e-5)
    finally:
        trainer.close()


def test_fine_tuned_from_a_folder_exported_and_loaded_by_transformers_with_lower_loss(
    tmp_path: Path,
) -> None:
    reference = tiny_llama(tmp_path / "hf")
    cfg = hf_config(tmp_path / "hf", tmp_path / "run")
    cfg.train.max_steps = 8
    cfg.scheduler.warmup_steps = 1
    cfg.optimizer.lr = 3e-3
    trainer = engine_from_hf(cfg, tmp_path / "run")
    try:
        # The mock data's first batch: what the loss is measured on, before and after.
        tokens = trainer.batches.next_step()[0]["tokens"]
        trainer.batches.load_state_dict({"consumed_samples": 0})
        checkpointer = checkpointer_for(trainer, tmp_path / "run", cfg)
        trainer.train(hooks=[checkpointer])
        checkpointer.close()
    finally:
        trainer.close()
    out = tmp_path / "export"
    assert main(["export", str(tmp_path / "run" / "checkpoints"), str(out)]) == 0
    tuned = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        before = reference(tokens, labels=tokens).loss.item()
        after = tuned(tokens, labels=tokens).loss.item()
    assert after < before - 0.1, (before, after)


def test_export_refuses_a_folder_that_is_not_empty_and_import_a_missing_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny_llama(tmp_path / "hf")
    assert main(["import", str(tmp_path / "nope"), str(tmp_path / "out")]) == 2
    assert "is not a Hugging Face model folder" in capsys.readouterr().err
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    assert main(["export", str(tmp_path / "imported"), str(tmp_path / "full")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"


def test_the_tokenizer_files_travel_with_the_weights(tmp_path: Path) -> None:
    """A folder's tokenizer (a BPE trained here, with its tokenizer_config.json) comes out of
    import + export unchanged, and transformers' AutoTokenizer reads the same ids from both."""
    from data.tools.make_tokenizer import train_bpe_tokenizer

    tiny_llama(tmp_path / "hf")
    texts = ["the quick brown fox jumps over the lazy dog"] * 50
    train_bpe_tokenizer(texts=texts, vocab_size=300, out=tmp_path / "hf" / "tokenizer.json")
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps(settings))
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
    assert main(["export", str(tmp_path / "imported"), str(tmp_path / "back")]) == 0
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "back" / name).read_bytes() == (tmp_path / "hf" / name).read_bytes()
    auto = transformers.AutoTokenizer
    text = "the lazy fox"
    ids = auto.from_pretrained(tmp_path / "back")(text)["input_ids"]
    assert ids == auto.from_pretrained(tmp_path / "hf")(text)["input_ids"] and ids


@pytest.mark.parametrize("name", ["tokenizer.json", "generation_config.json", "config.json"])
def test_export_copies_no_file_that_a_link_brings_in_from_elsewhere(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder's file that is a symbolic link to a private file: the export refuses, naming it,
    and writes nothing (it would have copied the private file's content)."""
    tiny_llama(tmp_path / "hf")
    secret = tmp_path / "private" / "secret.json"
    secret.parent.mkdir()
    secret.write_text(json.dumps({"token": "hf_SECRET", **hf_json(tmp_path / "hf" / name)}))
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
    link = tmp_path / "hf" / name
    link.unlink(missing_ok=True)
    link.symlink_to(secret)
    assert main(["export", str(tmp_path / "imported"), str(tmp_path / "back")]) == 2
    err = capsys.readouterr().err
    assert f"{link} is a symbolic link to {secret}, outside {tmp_path / 'hf'}" in err
    assert not (tmp_path / "back").exists() and not list(tmp_path.glob(".back*"))


def hf_json(path: Path) -> dict:
    """The JSON of a file, or nothing: the secret stands in for a file the export reads as JSON."""
    return json.loads(path.read_text()) if path.is_file() else {}


def test_a_link_inside_the_folder_and_the_hub_caches_blobs_are_copied(tmp_path: Path) -> None:
    from training.hf.convert import ConvertError, foreign_file

    folder = tmp_path / "models--org--m" / "snapshots" / "abc123"
    folder.mkdir(parents=True)
    (folder / "tokenizer.json").write_text("{}")
    (folder / "vocab.json").symlink_to("tokenizer.json")  # within the folder
    blob = tmp_path / "models--org--m" / "blobs" / "5f3a"
    blob.parent.mkdir()
    blob.write_text("{}")
    (folder / "merges.txt").symlink_to("../../blobs/5f3a")  # as huggingface_hub lays a cache out
    assert foreign_file(folder, "tokenizer.json") == folder / "tokenizer.json"
    assert foreign_file(folder, "vocab.json") == folder / "tokenizer.json"
    assert foreign_file(folder, "merges.txt") == blob
    assert foreign_file(folder, "missing.json") is None
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "5f3b").write_text("secret")
    (folder / "special_tokens_map.json").symlink_to("../../blobs/../../elsewhere/5f3b")
    (folder / "added_tokens.json").symlink_to(tmp_path / "nowhere")
    (folder / "chat_template.jinja").mkdir()
    for name in ("special_tokens_map.json", "added_tokens.json", "chat_template.jinja"):
        with pytest.raises(ConvertError, match=str(folder / name)):
            foreign_file(folder, name)
    # A blobs folder that is itself a link leads elsewhere too.
    other = tmp_path / "models--org--n"
    (other / "snapshots" / "def").mkdir(parents=True)
    (other / "blobs").symlink_to(elsewhere)
    (other / "snapshots" / "def" / "tokenizer.json").symlink_to("../../blobs/5f3b")
    with pytest.raises(ConvertError, match="outside"):
        foreign_file(other / "snapshots" / "def", "tokenizer.json")


def test_every_copy_of_a_foreign_file_goes_through_one_check() -> None:
    """training/hf copies files only through convert.copy_foreign (which asks foreign_file)."""
    import re

    root = Path(__file__).resolve().parents[3] / "training" / "hf"
    copying = re.compile(r"shutil\.copy|copyfile")
    for module in sorted(root.glob("*.py")):
        if module.name != "convert.py":
            assert not copying.search(module.read_text()), module.name


def assert_named_and_gone(out: Path, err: str) -> None:
    assert f"No space left on device writing {out}" in err, err
    assert "Traceback" not in err
    assert not out.exists() and not list(out.parent.glob(f".{out.name}*"))


@pytest.mark.parametrize("error", FULL_DISK)
def test_a_full_disk_during_import_is_named_and_leaves_nothing(
    tmp_path: Path, error: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """torch's checkpoint writer (every tensor goes through torch.save) runs out of space."""
    tiny_llama(tmp_path / "hf")
    monkeypatch.setattr(torch, "save", fills_up(torch.save, 3, error))
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 2
    assert_named_and_gone(tmp_path / "imported", capsys.readouterr().err)


@pytest.mark.parametrize("error", FULL_DISK)
def test_a_full_disk_during_export_is_named_and_leaves_nothing(
    tmp_path: Path, error: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The safetensors files of the export run out of space, a few tensors in."""
    from models.hf.safetensors_io import ShardWriter

    tiny_llama(tmp_path / "hf")
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
    monkeypatch.setattr(ShardWriter, "write", fills_up(ShardWriter.write, 3, error))
    assert main(["export", str(tmp_path / "imported"), str(tmp_path / "back")]) == 2
    assert_named_and_gone(tmp_path / "back", capsys.readouterr().err)


def qwen2_labelled_llama(folder: Path, layers: int = 4) -> None:
    """A Qwen2 folder (biases on q, k and v: 3 per layer) whose config.json says Llama."""
    config = transformers.Qwen2Config(
        vocab_size=200,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(config).save_pretrained(folder)
    hf = json.loads((folder / "config.json").read_text())
    hf["architectures"] = ["LlamaForCausalLM"]
    (folder / "config.json").write_text(json.dumps(hf))


def test_a_folder_with_tensors_its_family_map_does_not_read_is_refused_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Llama map reads no q/k/v biases: `recipes import`, `model=<folder>`,
    `checkpoint.pretrained_dir=<folder>` (before launch and on the ranks) all refuse the folder,
    naming the first few of its 12 biases and their count, instead of dropping them."""
    from config.rules.pretrained import pretrained_problems
    from config.tree import ConfigError, apply_overrides
    from models.hf import llama
    from recipes.registry import resolve
    from training.hf.convert import iter_tensors

    folder = tmp_path / "hf"
    qwen2_labelled_llama(folder)
    biases = sorted(n for n, _ in iter_tensors(folder) if n.endswith("_proj.bias"))
    assert len(biases) == 12
    first = ", ".join(biases[:5])
    named = (
        f"12 tensors that the LlamaForCausalLM map neither reads nor knows to skip ({first}, ...)"
    )

    assert main(["import", str(folder), str(tmp_path / "imported")]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "imported").exists()

    _, cfg = resolve("tiny_gpt_pretrain", [])
    with pytest.raises(ConfigError) as by_model:
        apply_overrides(cfg, [f"model={folder}"])
    assert named in dict(by_model.value.problems)["model"]

    # A model section that is the folder's as the Llama map reads it (no biases): the checker
    # refuses the folder before launch, the ranks when they load it.
    hf = json.loads((folder / "config.json").read_text())
    names = {n for n, _ in iter_tensors(folder)}
    model = llama.to_model(hf, names)
    model.seq_length = 32
    before_launch = pretrained_problems(model, folder, str(folder))
    assert [p.field for p in before_launch] == ["checkpoint.pretrained_dir"]
    assert named in before_launch[0].message
    assert main(["check", "tiny_gpt_pretrain", f"checkpoint.pretrained_dir={folder}"]) == 2
    assert named in capsys.readouterr().out

    tiny_llama(tmp_path / "llama")
    cfg = hf_config(tmp_path / "llama", tmp_path / "run")
    cfg.model = model
    cfg.checkpoint.pretrained_dir = str(folder)
    with pytest.raises(ValueError, match="neither reads nor knows to skip") as on_the_ranks:
        engine_from_hf(cfg, tmp_path / "run")
    assert named in str(on_the_ranks.value)


def test_rotary_inverse_frequencies_are_known_skips(tmp_path: Path) -> None:
    """Older transformers saved each layer's RoPE inv_freq buffer: computed from config.json, not
    read, and no reason to refuse a folder."""
    from safetensors.torch import load_file, save_file

    from config.hf import model_from_hf

    tiny_llama(tmp_path / "hf")
    path = tmp_path / "hf" / "model.safetensors"
    tensors = load_file(path)
    for i in range(2):
        tensors[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    save_file(tensors, path, metadata={"format": "pt"})
    assert model_from_hf(tmp_path / "hf").num_layers == 2
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
