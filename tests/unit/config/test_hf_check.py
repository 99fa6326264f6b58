"""A Hugging Face folder on the login node, without torch: `checkpoint.pretrained_dir` is checked
against the model section before launch, and `model=<folder>` takes the folder's architecture.

The folders are written by hand (config.json as the family's `to_hf` writes it, plus a
model.safetensors of a few numpy zeros): the checker reads config.json and the safetensors headers
only, never the weights.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from config.hardware import Cluster
from config.hf import model_override
from config.rules import validate
from config.schema import ModelConfig
from config.tree import ConfigError, apply_overrides
from launchers.inputs import check_inputs
from launchers.profile import Profile
from models.hf import llama as hf_llama
from models.presets.llama import llama3_8b
from models.presets.qwen import qwen3_8b
from recipes.registry import get
from recipes.shrink import shrink
from tests.support import children

H100x8 = Cluster(num_nodes=1, gpus_per_node=8, gpu="h100")
LOCAL = Profile(executor="local")
HAS_QWEN3_MAP = importlib.util.find_spec("models.hf.qwen3") is not None


def hf_folder(folder: Path, config: dict[str, Any]) -> Path:
    """A Hugging Face folder: `config` as config.json and a one-tensor model.safetensors."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    save_file(
        {"model.norm.weight": np.zeros(4, dtype=np.float32)}, str(folder / "model.safetensors")
    )
    return folder


def llama_folder(folder: Path, **changes: Any) -> Path:
    """Meta-Llama-3-8B's architecture (as llama3_8b_sft has it), with `changes` to its fields."""
    model = llama3_8b(seq_length=2048)
    for name, value in changes.items():
        setattr(model, name, value)
    return hf_folder(folder, hf_llama.to_hf(model))


def sft(*overrides: str):
    cfg = get("llama3_8b_sft").config()
    return apply_overrides(cfg, list(overrides))


def problems(cfg) -> dict[str, str]:
    return {p.field: p.message for p in validate(cfg, H100x8)}


def recipes(*args: str) -> subprocess.CompletedProcess:
    """The command as a user runs it (tests/unit/recipes/test_cli.py's way)."""
    return children.run(
        [sys.executable, "-m", "recipes", *args], capture_output=True, text=True, timeout=60
    )


# JSON nested deeper than Python's reader follows (it raises RecursionError, not a ValueError).
DEEP = "[" * 100_000 + "]" * 100_000


# --- checkpoint.pretrained_dir against the model section ---------------------------------------
def test_a_matching_folder_is_accepted(tmp_path: Path) -> None:
    folder = llama_folder(tmp_path / "Meta-Llama-3-8B")
    assert problems(sft(f"checkpoint.pretrained_dir={folder}")) == {}


def test_a_mismatching_folder_is_refused_field_by_field(tmp_path: Path) -> None:
    folder = llama_folder(tmp_path / "other", ffn_hidden_size=12288, num_layers=36)
    found = problems(sft(f"checkpoint.pretrained_dir={folder}"))
    assert set(found) == {"model.ffn_hidden_size", "model.num_layers"}
    message = found["model.ffn_hidden_size"]
    assert "14336" in message and "12288" in message  # ours, then the folder's
    assert "set model.ffn_hidden_size=12288" in message
    assert f"model={folder}" in message  # or take the whole architecture
    assert "set model.num_layers=36" in found["model.num_layers"]


def test_training_choices_are_not_compared(tmp_path: Path) -> None:
    """Sequence length, dropout and recompute are the recipe's, whatever the folder says."""
    folder = llama_folder(tmp_path / "m", seq_length=8192)
    cfg = sft(
        f"checkpoint.pretrained_dir={folder}",
        "model.seq_length=1024",
        "model.hidden_dropout=0.1",
        "model.recompute_granularity=selective",
    )
    assert problems(cfg) == {}


def test_booleans_are_written_as_overrides(tmp_path: Path) -> None:
    folder = llama_folder(tmp_path / "tied", share_embeddings_and_output_weights=True)
    found = problems(sft(f"checkpoint.pretrained_dir={folder}"))
    assert (
        "set model.share_embeddings_and_output_weights=true"
        in (found["model.share_embeddings_and_output_weights"])
    )


@pytest.mark.parametrize(
    ("write", "expected"),
    [
        (lambda f: (f / "config.json").write_text("{not json"), "is not JSON"),
        (
            lambda f: (f / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHead"]})),
            "LlamaForCausalLM",  # the supported ones are listed
        ),
        (lambda f: (f / "model.safetensors").write_bytes(b"\x05"), "not a safetensors file"),
        (
            lambda f: (f / "config.json").write_text(
                json.dumps({"architectures": ["LlamaForCausalLM"]})
            ),
            "has no field",
        ),
        (lambda f: (f / "config.json").write_text(DEEP), "config.json is not JSON"),
        (
            lambda f: (f / "model.safetensors").write_bytes(
                len(DEEP).to_bytes(8, "little") + DEEP.encode()
            ),
            "model.safetensors is not a safetensors file",
        ),
        (
            lambda f: (f / "model.safetensors.index.json").write_text(DEEP),
            "model.safetensors.index.json is not a safetensors index",
        ),
    ],
    ids=[
        "not-json",
        "unknown-architecture",
        "bad-safetensors",
        "missing-field",
        "nested-config",
        "nested-header",
        "nested-index",
    ],
)
def test_an_unreadable_folder_is_a_problem_of_pretrained_dir(
    tmp_path: Path, write: Any, expected: str
) -> None:
    folder = llama_folder(tmp_path / "m")
    write(folder)
    found = problems(sft(f"checkpoint.pretrained_dir={folder}"))
    assert list(found) == ["checkpoint.pretrained_dir"]
    assert expected in found["checkpoint.pretrained_dir"]


def test_pytorch_bin_weights_are_named(tmp_path: Path) -> None:
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf_llama.to_hf(llama3_8b())))
    (folder / "pytorch_model.bin").write_bytes(b"")
    found = problems(sft(f"checkpoint.pretrained_dir={folder}"))
    assert "pytorch_model.bin" in found["checkpoint.pretrained_dir"]
    assert "safetensors" in found["checkpoint.pretrained_dir"]


def test_a_megatron_checkpoint_is_left_to_the_engine(tmp_path: Path) -> None:
    (tmp_path / "ckpt" / "iter_0000100").mkdir(parents=True)
    assert problems(sft(f"checkpoint.pretrained_dir={tmp_path / 'ckpt'}")) == {}


def test_a_missing_folder_is_refused_before_launch_never_downloaded(tmp_path: Path) -> None:
    """The checker cannot tell a missing path from one the ranks see elsewhere; the launcher's
    input check can, as for data.path: it refuses it, a hub id included."""
    for given in (str(tmp_path / "nope"), "Qwen/Qwen3-8B"):
        cfg = sft(f"checkpoint.pretrained_dir={given}", f"data.path={tmp_path}")
        assert "checkpoint.pretrained_dir" not in problems(cfg)
        with pytest.raises(ConfigError) as err:
            check_inputs(cfg, LOCAL, tmp_path)
        [message] = [m for f, m in err.value.problems if f == "checkpoint.pretrained_dir"]
        assert f"{given} does not exist" in message and "hub" in message


def test_the_launcher_compares_the_folder_at_its_host_path(tmp_path: Path) -> None:
    """In a container the login node sees the folder through the profile's mounts only."""
    llama_folder(tmp_path / "models" / "m", vocab_size=32000)
    (tmp_path / "train.jsonl").write_text('{"prompt": "q", "response": "a"}\n')
    profile = Profile(executor="slurm", container_image="img.sqsh", mounts=[f"{tmp_path}:/lustre"])
    cfg = sft(
        "checkpoint.pretrained_dir=/lustre/models/m",
        "data.path=/lustre/train.jsonl",
        "data.tokenizer=/lustre/models/m",
    )
    with pytest.raises(ConfigError) as err:
        check_inputs(cfg, profile, tmp_path)
    fields = [f for f, _ in err.value.problems]
    assert fields == ["model.vocab_size"]
    assert "model=/lustre/models/m" in err.value.problems[0][1]


# --- model=<folder> -----------------------------------------------------------------------------
def test_model_override_takes_the_folders_architecture(tmp_path: Path) -> None:
    folder = llama_folder(tmp_path / "m", num_layers=4, hidden_size=256, ffn_hidden_size=512)
    cfg = sft("model.hidden_dropout=0.1", "model.recompute_granularity=selective")
    cfg = apply_overrides(cfg, [f"model={folder}"])
    m = cfg.model
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size) == (4, 256, 512)
    # The recipe's training choices stay.
    assert m.seq_length == 2048 and m.hidden_dropout == 0.1
    assert m.recompute_granularity == "selective"
    # And the folder then passes the check as pretrained_dir.
    apply_overrides(cfg, [f"checkpoint.pretrained_dir={folder}"])
    assert problems(cfg) == {}


def test_overrides_apply_in_order(tmp_path: Path) -> None:
    folder = llama_folder(tmp_path / "m", num_layers=4)
    after = sft(f"model={folder}", "model.num_layers=2", "model.seq_length=4096")
    assert after.model.num_layers == 2 and after.model.seq_length == 4096
    before = sft("model.num_layers=2", f"model={folder}")
    assert before.model.num_layers == 4  # the folder's, replacing the earlier override


def test_model_override_in_python(tmp_path: Path) -> None:
    folder = llama_folder(tmp_path / "m", num_layers=4)
    ours = llama3_8b(seq_length=1024)
    ours.attention_dropout = 0.1
    model = model_override(folder, ours)
    assert model.num_layers == 4 and model.seq_length == 1024 and model.attention_dropout == 0.1
    with pytest.raises(ValueError, match="does not exist"):
        model_override(tmp_path / "nope", ours)
    (folder / "model.safetensors").unlink()  # config.json alone: the tensor names are missing
    with pytest.raises(ValueError, match="has no model.safetensors"):
        model_override(folder, ours)


def not_a_folder(tmp_path: Path, kind: str) -> Path:
    """A path that `model=` must refuse: missing, an empty folder, config.json without weights,
    a file."""
    path = tmp_path / kind
    if kind == "empty":
        path.mkdir()
    elif kind == "no-weights":
        path.mkdir()
        (path / "config.json").write_text(json.dumps(hf_llama.to_hf(llama3_8b())))
    elif kind == "a-file":
        path.write_text("")
    return path


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("missing", "does not exist"),
        ("empty", "has no config.json"),
        ("no-weights", "has no model.safetensors"),
        ("a-file", "is a file"),
    ],
)
def test_model_override_names_what_is_wrong(tmp_path: Path, kind: str, expected: str) -> None:
    path = not_a_folder(tmp_path, kind)
    with pytest.raises(ConfigError) as err:
        sft(f"model={path}")
    [(field, message)] = err.value.problems
    assert field == "model" and expected in message and str(path) in message


def test_model_override_of_an_unknown_architecture(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path / "gpt2", {"architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(ConfigError) as err:
        sft(f"model={folder}")
    [(field, message)] = err.value.problems
    assert field == "model" and "GPT2LMHeadModel" in message and "LlamaForCausalLM" in message


@pytest.mark.parametrize(
    "args",
    [
        ["check", "llama3_8b_sft", "model={folder}"],
        ["check", "llama3_8b_sft", "checkpoint.pretrained_dir={folder}"],
        ["import", "{folder}", "{out}"],
    ],
    ids=["model", "pretrained_dir", "import"],
)
def test_cli_refuses_an_unknown_architecture_naming_it_and_the_families(
    tmp_path: Path, args: list[str]
) -> None:
    folder = hf_folder(tmp_path / "foo", {"architectures": ["FooForCausalLM"], "hidden_size": 8})
    out = recipes(*(a.format(folder=folder, out=tmp_path / "out") for a in args))
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "['FooForCausalLM']" in text and "no family map here reads" in text
    assert "Qwen2ForCausalLM (Qwen2 / Qwen2.5)" in text and "Phi3ForCausalLM" in text
    assert text.count("LlamaForCausalLM") == 1  # the families listed once, not twice
    assert "Traceback" not in text and not (tmp_path / "out").exists()


# --- the command line ---------------------------------------------------------------------------
def test_cli_check_refuses_a_mismatching_folder(tmp_path: Path) -> None:
    folder = llama_folder(tmp_path / "m", ffn_hidden_size=12288)
    out = recipes("check", "llama3_8b_sft", f"checkpoint.pretrained_dir={folder}")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "model.ffn_hidden_size" in out.stdout and "12288" in out.stdout
    report = json.loads(
        recipes("check", "llama3_8b_sft", f"checkpoint.pretrained_dir={folder}", "--json").stdout
    )
    assert [e["field"] for e in report["errors"]] == ["model.ffn_hidden_size"]


def test_cli_check_with_model_override_passes(tmp_path: Path) -> None:
    folder = llama_folder(tmp_path / "m", ffn_hidden_size=12288)
    out = recipes(
        "check", "llama3_8b_sft", f"model={folder}", f"checkpoint.pretrained_dir={folder}"
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_cli_check_names_a_config_json_nested_too_deep(tmp_path: Path) -> None:
    folder = llama_folder(tmp_path / "m")
    (folder / "config.json").write_text(DEEP)
    for args in (["check", "llama3_8b_sft"], ["show", "llama3_8b_sft", f"model={folder}"]):
        out = recipes(*args, f"checkpoint.pretrained_dir={folder}")
        assert out.returncode == 2, out.stdout + out.stderr
        assert f"{folder / 'config.json'} is not JSON this reader takes" in out.stdout + out.stderr
        assert "nested deeper than" in out.stdout + out.stderr
        assert "Traceback" not in out.stderr


def test_cli_model_override_errors(tmp_path: Path) -> None:
    out = recipes("show", "llama3_8b_sft", f"model={tmp_path / 'nope'}")
    assert out.returncode == 2
    assert "model:" in out.stderr and "does not exist" in out.stderr


def test_cli_run_refuses_before_launch(tmp_path: Path) -> None:
    folder = llama_folder(tmp_path / "m", vocab_size=32000)
    out = recipes(
        "run",
        "llama3_8b_sft",
        f"checkpoint.pretrained_dir={folder}",
        f"logging.run_dir={tmp_path / 'run'}",
        "--dryrun",
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "model.vocab_size" in out.stdout
    assert not (tmp_path / "run").exists()


def test_cli_check_of_a_folder_imports_no_torch(tmp_path: Path) -> None:
    folder = llama_folder(tmp_path / "m")
    args = ["check", "llama3_8b_sft", f"model={folder}", f"checkpoint.pretrained_dir={folder}"]
    code = (
        f"import sys, runpy; sys.argv = ['recipes', *{args!r}]\n"
        "try:\n    runpy.run_module('recipes', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'megatron', 'nemo_run', 'fiddle', 'safetensors.torch') "
        "if m in sys.modules]\nprint('HEAVY', heavy)\n"
    )
    out = children.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr
    assert "valid" in out.stdout


# --- Qwen3 8B -----------------------------------------------------------------------------------
# Qwen/Qwen3-8B's published config.json, the fields that shape the model.
QWEN3_8B_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 12288,
    "max_position_embeddings": 40960,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
}


def test_qwen3_8b_preset_has_the_published_numbers() -> None:
    from config.cost.memory import count_parameters

    m: ModelConfig = qwen3_8b()
    hf = QWEN3_8B_CONFIG
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size) == (36, 4096, 12288)
    assert (m.num_attention_heads, m.num_query_groups, m.kv_channels) == (32, 8, hf["head_dim"])
    assert (m.vocab_size, m.rotary_base, m.layernorm_epsilon) == (151936, 1_000_000, 1e-6)
    assert m.qk_layernorm and not m.share_embeddings_and_output_weights
    assert not m.add_bias_linear and not m.add_qkv_bias
    count = count_parameters(get("qwen3_8b_pretrain").config())
    assert count.total / 1e9 == pytest.approx(8.19, rel=0.01)  # "8.2B" on the model card


@pytest.mark.skipif(not HAS_QWEN3_MAP, reason="models/hf/qwen3.py is not there yet")
def test_qwen3_8b_sft_takes_the_published_folder(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path / "Qwen3-8B", QWEN3_8B_CONFIG)
    cfg = get("qwen3_8b_sft").config()
    apply_overrides(cfg, [f"checkpoint.pretrained_dir={folder}"])
    assert problems(cfg) == {}
    # The Llama recipe cannot take it: each differing field is named.
    found = problems(sft(f"checkpoint.pretrained_dir={folder}"))
    assert {"model.num_layers", "model.qk_layernorm", "model.vocab_size"} <= set(found)


@pytest.mark.parametrize("name", ["qwen3_8b_pretrain", "qwen3_8b_sft"])
def test_qwen3_8b_recipes_check_and_shrink(name: str) -> None:
    recipe = get(name)
    cfg = recipe.config()
    assert validate(cfg, recipe.cluster) == []
    assert (cfg.parallel.tensor_model_parallel_size, cfg.parallel.sequence_parallel) == (4, True)
    assert validate(shrink(cfg), recipe.cluster) == []
    out = recipes("check", name, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["valid"] is True


# --- Qwen2.5 7B, Phi-3 ---------------------------------------------------------------------------
def test_qwen25_7b_sft_takes_the_published_folder(tmp_path: Path) -> None:
    from tests.unit.models.test_presets_published import PUBLISHED

    folder = hf_folder(tmp_path / "Qwen2.5-7B", PUBLISHED["qwen2.5-7b"][1])
    for name in ("qwen25_7b_sft", "qwen25_7b_lora"):
        cfg = apply_overrides(get(name).config(), [f"checkpoint.pretrained_dir={folder}"])
        assert problems(cfg) == {}, name
    # The Llama recipe cannot take it: its q/k/v biases are named among the differences.
    assert {"model.add_qkv_bias", "model.num_layers"} <= set(
        problems(sft(f"checkpoint.pretrained_dir={folder}"))
    )


def test_phi3_window_bounds_the_training_length(tmp_path: Path) -> None:
    """Phi-3-mini-4k's published sliding_window 2047: a recipe's 4096 (and 2048) is refused
    naming the window and the fix; 1920 (what the message proposes, which TP 2 with sequence
    parallel divides) is taken, and so is 2047 without sequence parallel."""
    from tests.unit.models.test_presets_published import PUBLISHED

    folder = hf_folder(tmp_path / "Phi-3-mini-4k-instruct", PUBLISHED["phi-3-mini-4k"][1])
    base = [f"model={folder}", f"checkpoint.pretrained_dir={folder}"]
    for length in (4096, 2048):
        found = problems(sft(*base, f"model.seq_length={length}"))
        assert set(found) == {"model.seq_length"}, found
        assert "sliding_window" in found["model.seq_length"]
        assert "set model.seq_length to 2047 or less (e.g. 1920)" in found["model.seq_length"]
    assert problems(sft(*base, "model.seq_length=1920")) == {}
    assert problems(sft(*base, "model.seq_length=2047", "parallel.sequence_parallel=false")) == {}
