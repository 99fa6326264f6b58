"""The registries of data kinds (`data.kind`) and model architectures (`model.arch`).

Everything the project does differently for a kind or an architecture is said here, once: what
the checker requires of it, which files the launcher looks for before the queue, and which
function builds it on the ranks. The engine, the input check and the rules ask these entries
instead of branching on names, so a new kind is its own module plus one line in `DATA_KINDS`
(a new architecture: its module plus one line in `MODEL_ARCHS`).

The builders are named as "module:function" strings and imported only on the ranks (`load`):
this floor stays free of torch and of the packages above it.

- A data kind's `source(cfg, derived, dp_rank, device, part)` returns the batch source of one
  rank for `part` "train" or "valid": `next_step()` gives the step's microbatches (dicts of
  tensors), `consumed_samples` counts global samples handed out, and `state_dict()` /
  `load_state_dict()` save and restore its position (`{"consumed_samples": n}` alone must
  restore it, at another world size too).
- An architecture's `builder(cfg, derived, transformer_config, device)` returns this rank's model
  chunks (one per virtual pipeline stage); its `forward(model, batch)` runs one microbatch through
  one chunk and returns (per-token loss or the pipeline's output tensor, loss mask).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from config.blend import is_blend_file, parse_blend


@dataclass(frozen=True, slots=True)
class DataKind:
    name: str
    source: str  # "module:function" of the rank's batch source, see the module docstring
    summary: str  # what data.path holds, for error messages and the README
    needs_path: bool = True
    needs_tokenizer: bool = True  # False: a null tokenizer (ids are the data)
    # Takes its validation part by data.split's weights (train.eval_interval needs weight there).
    uses_split: bool = True
    has_validation: bool = True  # False: train.eval_interval cannot evaluate on it
    packs: bool = False  # data.sequence_packing means something
    # Packed rows carry segment ids and attend within their segment only (an explicit mask).
    masks_packed_rows: bool = False
    images: bool = False  # feeds images: only an architecture with `takes_images` can train on it
    # Renders its samples with data.tokenizer's chat template: an HF tokenizer folder that has one.
    needs_chat_template: bool = False
    # The files and folders data.path names, as the ranks will open them (the launcher's check);
    # ValueError for a data.path it cannot read (the checker reports it).
    inputs: Callable[[str], list[str]] = lambda path: [path]


@dataclass(frozen=True, slots=True)
class ModelArch:
    name: str
    builder: str  # "module:function": this rank's model chunks
    forward: str  # "module:function": one microbatch through one chunk
    summary: str
    takes_images: bool = False
    # The model pads its input sequence to what sequence and context parallelism split it into
    # (Megatron-Core's LLaVAModel does, after expanding the image tokens), so model.seq_length
    # need not divide by them.
    pads_sequence: bool = False
    # "module:function" rules of the checker that hold for this architecture only (config/rules/).
    rules: tuple[str, ...] = ()


def _indexed_inputs(path: str) -> list[str]:
    """Each blend prefix's .bin and .idx (object storage, s3:// and the like, is left to Megatron);
    a blend file itself first, and its prefixes where this machine can read it."""
    if is_blend_file(path) and not os.path.isfile(path):
        return [path]  # seen only where the ranks run (a container's mount): checked there
    prefixes, _ = parse_blend(path)
    files = [p + ext for p in prefixes if "://" not in p for ext in (".bin", ".idx")]
    return [path, *files] if is_blend_file(path) else files


def _by_name(*entries: Any) -> dict[str, Any]:
    return {entry.name: entry for entry in entries}


# One entry per data.kind; the order is the one error messages list them in.
DATA_KINDS: dict[str, DataKind] = _by_name(
    DataKind(
        name="mock",
        source="data.pretrain:batches",
        summary="Megatron's mock GPT data (no files)",
        needs_path=False,
        needs_tokenizer=False,
        uses_split=False,
        inputs=lambda path: [],
    ),
    DataKind(
        name="indexed",
        source="data.pretrain:batches",
        summary="Megatron .bin/.idx prefixes, or a weighted blend 'w1 prefix1 w2 prefix2 ...'",
        inputs=_indexed_inputs,
    ),
    DataKind(
        name="sft",
        source="data.sft:batches",
        summary="a JSONL file of prompt/response pairs",
        packs=True,
        masks_packed_rows=True,
    ),
    DataKind(
        name="chat",
        source="data.chat:batches",
        summary='a JSONL file of conversations ({"messages": [{"role": ..., "content": ...}]})',
        packs=True,
        masks_packed_rows=True,
        needs_chat_template=True,
    ),
    DataKind(
        name="energon",
        source="data.energon:batches",
        summary="a prepared Energon dataset folder or metadataset YAML",
        uses_split=False,
        has_validation=False,
        packs=True,
        images=True,
    ),
)

# One entry per model.arch.
MODEL_ARCHS: dict[str, ModelArch] = _by_name(
    ModelArch(
        name="gpt",
        builder="models.gpt:build_chunks",
        forward="models.gpt:forward",
        summary="decoder-only GPT: dense, MoE, MLA, MTP",
    ),
    ModelArch(
        name="llava",
        builder="models.llava:build_llava_chunks",
        forward="models.llava:forward",
        summary="a ViT and an MLP projector in front of the GPT",
        takes_images=True,
        pads_sequence=True,
        rules=("config.rules.vision:multimodal",),
    ),
)


def register_data_kind(kind: DataKind) -> DataKind:
    """Add a kind at run time (a plugin, a test); the catalog's own kinds are listed above."""
    if kind.name in DATA_KINDS:
        raise ValueError(f"data kind {kind.name!r} is registered twice")
    DATA_KINDS[kind.name] = kind
    return kind


def unregister_data_kind(name: str) -> None:
    DATA_KINDS.pop(name, None)


def load(ref: str) -> Any:
    """The object a "module:function" string names (imported on first use, on the ranks)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True, slots=True)
class HfFamily:
    """A Hugging Face architecture (`architectures[0]` of config.json) and its mapping module.

    The module (models/hf/) declares, without torch: `to_model(hf_config, tensor_names)` -> our
    ModelConfig; `to_hf(model)` -> config.json; `weights(model, padded_vocab_size, names)` ->
    Megatron key -> how it is made of Hugging Face tensors (models/hf/mapping.py), `names` being the
    folder's tensor names when there is a folder (they pick among spellings of one family's names,
    as llava-hf has several), else None; `matches(model)` -> True
    when an export of `model` without an origin should take this family. Optional:
    `skipped(model, name)` -> True for a tensor of a folder that the map leaves out on purpose (see
    `HF_UNREAD`); `attention_span(hf_config)` -> the longest sequence its layers attend over as
    whole-sequence causal attention (a sliding window's length; None: any), which bounds
    model.seq_length when the folder's weights are loaded (config/hf.py `differences`).
    """

    name: str
    module: str
    summary: str
    # quantization_config.quant_method values whose weights the map reads dequantized (GPT-OSS's
    # MXFP4 experts); a folder quantized any other way is refused (config/hf.py model_from_hf).
    dequantizes: tuple[str, ...] = ()


# "module:function" of the check every Hugging Face folder's tensors pass, whatever its family:
# unread_tensors(config.json, folder, model, tensor names) -> the names its map neither reads nor
# knows to skip (config/hf.py `model_from_hf` refuses a folder with any).
HF_UNREAD = "models.hf:unread_tensors"

# One entry per supported Hugging Face architecture; a family to come is its module plus a line.
HF_FAMILIES: dict[str, HfFamily] = _by_name(
    HfFamily("LlamaForCausalLM", "models.hf.llama", "Llama 3 / 3.1 / 3.2"),
    HfFamily("Qwen2ForCausalLM", "models.hf.qwen2", "Qwen2 / Qwen2.5"),
    HfFamily("MistralForCausalLM", "models.hf.mistral", "Mistral 7B"),
    HfFamily("Phi3ForCausalLM", "models.hf.phi3", "Phi-3 4K"),
    HfFamily("Qwen3ForCausalLM", "models.hf.qwen3", "Qwen3 dense"),
    HfFamily("Qwen3MoeForCausalLM", "models.hf.qwen3_moe", "Qwen3 mixture of experts"),
    HfFamily("MixtralForCausalLM", "models.hf.mixtral", "Mixtral"),
    HfFamily("Gemma3ForCausalLM", "models.hf.gemma3", "Gemma 3 text (1B)"),
    HfFamily(
        "Gemma3ForConditionalGeneration",
        "models.hf.gemma3_vlm",
        "Gemma 3 4B-27B: the language model (the vision tower is not loaded)",
    ),
    HfFamily("DeepseekV3ForCausalLM", "models.hf.deepseek_v3", "DeepSeek-V3"),
    HfFamily("GptOssForCausalLM", "models.hf.gpt_oss", "GPT-OSS", dequantizes=("mxfp4",)),
    HfFamily("Qwen3_5ForCausalLM", "models.hf.qwen3_5", "Qwen3.5 / 3.6 dense (Gated DeltaNet)"),
    HfFamily(
        "Qwen3_5ForConditionalGeneration",
        "models.hf.qwen3_5",
        "Qwen3.5 / 3.6 dense, published folders: the language model",
    ),
    HfFamily(
        "Qwen3_5MoeForCausalLM", "models.hf.qwen3_5_moe", "Qwen3.5 / 3.6 MoE (Gated DeltaNet)"
    ),
    HfFamily(
        "Qwen3_5MoeForConditionalGeneration",
        "models.hf.qwen3_5_moe",
        "Qwen3.5 / 3.6 MoE, published folders: the language model",
    ),
    HfFamily("Qwen3NextForCausalLM", "models.hf.qwen3_next", "Qwen3-Next (Gated DeltaNet, MoE)"),
    HfFamily("LlavaForConditionalGeneration", "models.hf.llava", "LLaVA (llava-hf, CLIP ViT)"),
)
