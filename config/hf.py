"""Hugging Face folders on the login node: config.json and the safetensors headers, without torch.

A Hugging Face model folder (config.json, model.safetensors or model-*.safetensors with their
index, tokenizer files) is what users hold of an open model; `tokenizer_size` reads how many ids
its tokenizer (or a bare tokenizer.json) emits. This module reads what the checker
needs from it in milliseconds: the architecture (`architectures[0]`, one entry of
`config.registry.HF_FAMILIES`), the model it describes as our `ModelConfig` (the family module's
`to_model`), and the names, dtypes and shapes of its tensors (the 8-byte length and JSON header at
the start of each safetensors file). Nothing here is ever a hub id: a path that does not exist is an
error.

`differences(model, folder)` lists the architecture fields where a recipe's `model` section and the
folder disagree; `checkpoint.pretrained_dir` refuses such a folder before launch, naming each field
and both values. Fields that are training choices (sequence length, dropout, init, recompute, the
MoE dispatcher and balancing loss) are not compared, but for one bound: a folder whose layers attend
within a sliding window (a family's `attention_span`) computes as the whole-sequence attention here
only up to the window's length, so a longer model.seq_length is listed too.

`model_override(folder, ours)` is what the override `model=<folder>` gives: the folder's
architecture with the recipe's training choices. A recipe function takes a folder's architecture
the same way in Python: `cfg.model = model_override("/models/Qwen3-8B", cfg.model)`.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import struct
from pathlib import Path
from typing import Any

from config.registry import HF_FAMILIES, HF_UNREAD, HfFamily, load
from config.schema import ModelConfig, VisionConfig

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_MAX_HEADER = 100 * 2**20  # safetensors' own limit on a header

# The fields a Hugging Face folder fixes: its weights' shapes, or what its forward computes.
ARCH_FIELDS = (
    "arch",
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "vocab_size",
    "normalization",
    "layernorm_epsilon",
    "activation",
    "position_embedding_type",
    "rotary_base",
    "rope_scaling",
    "rope_scaling_factor",
    "rope_original_max_position_embeddings",
    "rope_beta_fast",
    "rope_beta_slow",
    "rope_mscale",
    "rope_mscale_all_dim",
    "activation_func_clamp_value",
    "glu_linear_offset",
    "rope_correction_range_round_to_int",
    "window_size",
    "window_attn_skip_freq",
    "softmax_type",
    "rotary_base_local",
    "softmax_scale",
    "layernorm_zero_centered_gamma",
    "sandwich_norm",
    "scale_embeddings",
    "rotary_percent",
    "add_bias_linear",
    "add_qkv_bias",
    "qk_layernorm",
    "layernorm_zero_centered_gamma",
    "attention_output_gate",
    "experimental_attention_variant",
    "linear_attention_freq",
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "share_embeddings_and_output_weights",
    "num_moe_experts",
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "moe_shared_expert_gate",
    "moe_first_k_dense_layers",
    "moe_router_score_function",
    "moe_router_pre_softmax",
    "moe_router_enable_expert_bias",
    "moe_router_num_groups",
    "moe_router_group_topk",
    "moe_router_topk_scaling_factor",
    "multi_latent_attention",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_head_dim",
    "qk_pos_emb_head_dim",
    "v_head_dim",
    "mtp_num_layers",
)
VISION_FIELDS = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "image_size",
    "patch_size",
    "class_token",
    "projector_hidden_size",
)


def is_hf_folder(path: str | Path) -> bool:
    """A folder with a config.json and safetensors weights (not one of our checkpoints)."""
    folder = Path(path)
    has_weights = (folder / INDEX_FILE).is_file() or (folder / SINGLE_FILE).is_file()
    return (folder / CONFIG_FILE).is_file() and has_weights


def parse_json(text: str | bytes, name: str | Path) -> Any:
    """JSON that someone else wrote (config.json, tokenizer files, safetensors headers);
    ValueError naming it (`name`: its path, or what it is) when it is not UTF-8 JSON, or nests
    deeper than Python's reader follows (which raises RecursionError, a traceback otherwise)."""
    try:
        return json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{name} is not JSON: {err}") from None
    except RecursionError:
        raise ValueError(
            f"{name} is not JSON this reader takes: its lists and objects are nested deeper than "
            "Python's JSON reader follows (a damaged or crafted file; no Hugging Face file nests "
            "so deep)"
        ) from None


def read_json(path: str | Path) -> Any:
    """`parse_json` of the file at `path` (OSError when it cannot be read)."""
    return parse_json(Path(path).read_bytes(), path)


def read_config(folder: str | Path) -> dict[str, Any]:
    """config.json as a dict; ValueError naming the file when it is missing or not JSON."""
    path = Path(folder) / CONFIG_FILE
    if not Path(folder).exists():
        raise ValueError(
            f"{folder} does not exist (a local Hugging Face folder is needed: nothing is ever "
            "downloaded from a hub)"
        )
    try:
        data = read_json(path)
    except FileNotFoundError:
        raise ValueError(
            f"{folder} has no {CONFIG_FILE}: not a Hugging Face model folder"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds {type(data).__name__}, not a JSON object")
    return data


class UnknownArchitecture(ValueError):
    """A config.json whose `architectures` names no family of HF_FAMILIES (its message lists
    them, so callers add no list of their own)."""


def supported_families() -> str:
    """'LlamaForCausalLM (Llama 3 / 3.1 / 3.2), ...': what error messages list."""
    return ", ".join(f"{f.name} ({f.summary})" for f in HF_FAMILIES.values())


def family(hf: dict[str, Any], folder: str | Path) -> HfFamily:
    """The registry entry of the folder's architecture; UnknownArchitecture naming the
    architecture and the supported families (before anything is launched or converted)."""
    names = hf.get("architectures") or []
    if not isinstance(names, list):
        names = [names]
    for name in names:
        if isinstance(name, str) and name in HF_FAMILIES:
            return HF_FAMILIES[name]
    given = (
        f"names architectures {names}"
        if names
        else "has no `architectures` list (transformers writes one on save_pretrained)"
    )
    raise UnknownArchitecture(
        f"{Path(folder) / CONFIG_FILE} {given}, which no family map here reads; the supported "
        f"families are {supported_families()}"
    )


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file (names, dtypes, shapes, offsets)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path} is not a safetensors file (shorter than its header)")
        (length,) = struct.unpack("<Q", raw)
        if length > _MAX_HEADER:
            raise ValueError(f"{path} is not a safetensors file (header of {length} bytes)")
        text = f.read(length)
    try:
        header = parse_json(text, "its header")
    except ValueError as err:
        raise ValueError(f"{path} is not a safetensors file: {err}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path} is not a safetensors file (its header is not a JSON object)")
    header.pop("__metadata__", None)
    return header


def safetensors_tensors(folder: str | Path) -> dict[str, tuple[str, str, tuple[int, ...]]]:
    """Every tensor of a Hugging Face folder: name -> (file, dtype, shape), from the headers."""
    folder = Path(folder)
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = parse_json(index.read_bytes(), "it")["weight_map"]
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{index} is not a safetensors index ({err})") from None
        files = sorted(set(weight_map.values()))
    elif (folder / SINGLE_FILE).is_file():
        files = [SINGLE_FILE]
    else:
        raise ValueError(f"{folder} holds no {SINGLE_FILE} or {INDEX_FILE}")
    out = {}
    for file in files:
        if Path(file).name != file:
            raise ValueError(f"{index} names {file!r}, which is not a file of {folder}")
        for name, entry in read_header(folder / file).items():
            out[name] = (file, entry["dtype"], tuple(entry["shape"]))
    return out


def model_from_hf(
    folder: str | Path, seq_length: int | None = None, names: set[str] | None = None
) -> ModelConfig:
    """The architecture a Hugging Face folder describes, as our model section.

    `seq_length` is a training choice, not the model's: the recipe's when given, else the
    folder's max_position_embeddings capped at 4096. `names`: the folder's tensor names when the
    caller has read its headers already (else they are read here).
    """
    hf = read_config(folder)
    entry = family(hf, folder)
    quantized = hf.get("quantization_config")
    method = quantized.get("quant_method", "?") if isinstance(quantized, dict) else "?"
    if quantized and method not in entry.dequantizes:
        raise ValueError(
            f"{Path(folder) / CONFIG_FILE} holds quantized weights (quantization_config, "
            f"quant_method {method!r}); dequantize them to BF16 first (DeepSeek-V3's FP8 release "
            "ships a script for it)"
        )
    if names is None:
        names = set(safetensors_tensors(folder)) if is_hf_folder(folder) else set()
    model: ModelConfig = load(f"{entry.module}:to_model")(hf, names)
    unread = load(HF_UNREAD)(hf, Path(folder), model, names)
    if unread:
        raise ValueError(unread_message(folder, entry.name, unread))
    if seq_length is not None:
        model.seq_length = seq_length
    else:  # the folder's own length, within what it computes as full attention
        span = attention_span(folder, hf)
        if span is not None:
            model.seq_length = min(model.seq_length, span)
    return model


def attention_span(folder: str | Path, hf: dict[str, Any] | None = None) -> int | None:
    """The longest sequence the folder's model attends over as Megatron-Core's causal attention
    does (None: any length): a family module's optional `attention_span(config.json)`, for
    folders whose layers attend within a sliding window (Phi-3's config.json sliding_window 2047:
    up to 2047 tokens no window ever cuts a token off, beyond it one does)."""
    hf = read_config(folder) if hf is None else hf
    span = getattr(importlib.import_module(family(hf, folder).module), "attention_span", None)
    return None if span is None else span(hf)


def unread_message(folder: str | Path, architecture: str, unread: list[str], shown: int = 5) -> str:
    """Why a folder with tensors its family's map does not read is refused, naming the first few."""
    listed = ", ".join(unread[:shown]) + (", ..." if len(unread) > shown else "")
    return (
        f"{folder} holds {len(unread)} tensors that the {architecture} map neither reads nor knows "
        f"to skip ({listed}): an import, a run or an export would drop them. Its {CONFIG_FILE} "
        f"says {architecture}, but these weights are not all that: if they are another family's "
        "(a Qwen2 folder has q/k/v biases that Llama lacks), correct `architectures` there to "
        f"that family, one of {', '.join(HF_FAMILIES)}, or take a folder of a supported one"
    )


def _effective(model: ModelConfig, name: str) -> Any:
    """A field's value as the model uses it (the defaults that stand for another field resolved)."""
    value = getattr(model, name)
    if name == "num_query_groups" and value is None:
        return model.num_attention_heads
    if name == "kv_channels" and value is None and model.num_attention_heads:
        return model.hidden_size // model.num_attention_heads
    if name == "moe_ffn_hidden_size" and model.num_moe_experts:
        return value or model.ffn_hidden_size
    if name == "ffn_hidden_size" and model.num_moe_experts and not model.moe_first_k_dense_layers:
        return None  # every layer is MoE: the dense width is never used
    if not model.num_moe_experts and name.startswith("moe_"):
        return None
    if not model.multi_latent_attention and name in (
        "q_lora_rank",
        "kv_lora_rank",
        "qk_head_dim",
        "qk_pos_emb_head_dim",
        "v_head_dim",
    ):
        return None
    if model.rope_scaling is None and name.startswith("rope_") and name != "rope_scaling":
        return None
    if model.window_size is None and name == "window_attn_skip_freq":
        return None
    if model.experimental_attention_variant is None and name.startswith("linear_"):
        return None  # Gated DeltaNet's sizes, unused without it
    return value


def differences(
    model: ModelConfig, folder: str | Path, names: set[str] | None = None
) -> list[tuple[str, Any, Any]]:
    """(field, ours, the folder's) for each architecture field where `model` and the folder differ."""
    theirs = model_from_hf(folder, model.seq_length, names)
    out = []
    span = attention_span(folder)
    if span is not None and model.seq_length > span:  # a training choice the folder bounds
        out.append(("model.seq_length", model.seq_length, span))
    for name in ARCH_FIELDS:
        a, b = _effective(model, name), _effective(theirs, name)
        if a != b:
            out.append((f"model.{name}", a, b))
    if (model.vision is None) != (theirs.vision is None):
        out.append(("model.vision", model.vision is not None, theirs.vision is not None))
    elif model.vision is not None and theirs.vision is not None:
        ours_v, theirs_v = model.vision, theirs.vision
        for name in VISION_FIELDS:
            a, b = getattr(ours_v, name), getattr(theirs_v, name)
            if name == "projector_hidden_size":
                a, b = a or model.hidden_size, b or theirs.hidden_size
            if a != b:
                out.append((f"model.vision.{name}", a, b))
    return out


# What reading a folder raises besides ValueError: a config.json without a field its family needs
# (KeyError), a field of the wrong type (TypeError), a family of HF_FAMILIES whose mapping module
# is not there (ImportError), a file that cannot be read (OSError). `read_error` words each one.
READ_ERRORS = (ValueError, KeyError, TypeError, ImportError, OSError)


def read_error(err: BaseException, folder: str | Path) -> str:
    """One sentence for an error of READ_ERRORS met while reading `folder`, naming the file."""
    if isinstance(err, KeyError):
        return f"{Path(folder) / CONFIG_FILE} has no field {err}, which its architecture needs"
    if isinstance(err, ImportError):
        return f"{folder}: the mapping module of its architecture cannot be imported ({err})"
    if isinstance(err, OSError):
        return f"{folder} cannot be read ({err})"
    return str(err)


def model_override(folder: str | Path, ours: ModelConfig) -> ModelConfig:
    """The model section `model=<folder>` gives: the folder's architecture with `ours`' training
    choices (sequence length, dropout, recompute, dispatcher...). ValueError naming the folder when
    it is not a readable Hugging Face folder."""
    try:
        theirs = model_from_hf(folder, ours.seq_length)
    except READ_ERRORS as err:
        raise ValueError(read_error(err, folder)) from None
    if not is_hf_folder(folder):  # the tensor names settle what config.json leaves open
        raise ValueError(f"{folder} has no {SINGLE_FILE} or {INDEX_FILE}")
    return with_training_fields(theirs, ours)


def with_training_fields(theirs: ModelConfig, ours: ModelConfig) -> ModelConfig:
    """`theirs` (from a folder) keeping `ours`' training choices: what `model=<folder>` gives."""
    keep = {f.name for f in dataclasses.fields(ModelConfig)} - set(ARCH_FIELDS) - {"vision"}
    for name in keep:
        setattr(theirs, name, getattr(ours, name))
    if theirs.vision is not None and ours.vision is not None:
        for name in ("freeze_vision", "freeze_language"):
            setattr(theirs.vision, name, getattr(ours.vision, name))
    return theirs


def tokenizer_size(path: str | Path) -> int | None:
    """How many ids the tokenizer at `path` can emit (data/tokenizer.py `LocalTokenizer.vocab_size`),
    read from its tokenizer.json alone (the `tokenizers` package: no torch, no transformers), so
    the checker and the launcher ask before launching. None when it cannot tell (no
    tokenizer.json, or one that does not parse: the ranks' loader names that error)."""
    p = Path(path).expanduser()
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        return None
    from tokenizers import Tokenizer

    try:
        size = Tokenizer.from_file(str(file)).get_vocab_size(with_added_tokens=True)
    except Exception:  # the Rust side raises a bare Exception with the parse error
        return None
    config = p / "tokenizer_config.json"
    if p.is_dir() and config.is_file():  # transformers adds these tokens on top of the file's
        try:
            added = read_json(config).get("added_tokens_decoder") or {}
            size = max([size, *(int(i) + 1 for i in added)])
        except (ValueError, AttributeError):
            pass
    return size


__all__ = [
    "VisionConfig",
    "UnknownArchitecture",
    "attention_span",
    "differences",
    "family",
    "is_hf_folder",
    "model_from_hf",
    "model_override",
    "parse_json",
    "read_error",
    "read_config",
    "read_json",
    "safetensors_tensors",
    "supported_families",
    "tokenizer_size",
    "with_training_fields",
]
