"""The data section, against the registry entry of its kind (config/registry.py): the path and
tokenizer the kind needs, the chat template a chat kind renders with, packing, the validation split
that evaluation reads, images."""

from __future__ import annotations

import os
from pathlib import Path

from config.blend import (
    is_blend_file,
    parse_blend,
    read_blend_file,
    split_weights,
    tokenizer_digest,
)
from config.finalize import Partial
from config.hardware import Cluster
from config.hf import read_json, tokenizer_size
from config.problems import Problem
from config.registry import DATA_KINDS
from config.schema import TrainingConfig, data_kind, masks_packed_rows, model_arch
from config.tree import ConfigError


def data(cfg: TrainingConfig, cluster: Cluster, d: Partial) -> list[Problem]:
    data = cfg.data
    out: list[Problem] = []
    kind = data_kind(cfg)
    if kind is None:
        return out  # an unknown kind: the choices rule names it and the valid ones
    if kind.needs_path and not data.path:
        out.append(Problem("data.path", f"data.kind='{kind.name}' needs a path to the dataset"))
    if data.path:
        try:
            kind.inputs(data.path)
        except ValueError as err:  # e.g. an indexed blend that is not "w1 prefix1 w2 prefix2"
            out.append(Problem("data.path", str(err)))
    if kind.needs_tokenizer and not data.tokenizer:
        out.append(
            Problem(
                "data.tokenizer", f"data.kind='{kind.name}' needs a local tokenizer file or folder"
            )
        )
    if kind.needs_chat_template and data.tokenizer:
        out += _chat_template(data.tokenizer, kind.name)
    if data.tokenizer:
        out += _tokenizer_here(cfg)
    out += _evaluation(cfg)
    if data.path and kind.name == "indexed" and is_blend_file(data.path):
        out += _blend_file(cfg)
    if data.stage_dir is not None:
        out += _stage_dir(data.stage_dir, kind.name)
    if data.sequence_packing and not kind.packs:
        packers = " or ".join(k.name for k in DATA_KINDS.values() if k.packs)
        out.append(
            Problem(
                "data.sequence_packing",
                f"packs the samples of data.kind {packers}; data.kind='{kind.name}' already fills "
                "every row with documents end to end. Set data.sequence_packing=false",
            )
        )
    cp = cfg.parallel.context_parallel_size
    if masks_packed_rows(cfg) and cp > 1:
        out.append(
            Problem(
                "data.sequence_packing",
                "packed rows keep their samples apart with an explicit attention mask, which "
                f"has no context-parallel form here (parallel.context_parallel_size={cp}); set "
                "data.sequence_packing=false or parallel.context_parallel_size=1",
            )
        )
    arch = model_arch(cfg)
    if arch is not None and kind.images and not arch.takes_images:
        out.append(
            Problem(
                "data.kind",
                f"'{kind.name}' feeds images, which model.arch='{arch.name}' cannot take; "
                "use model.arch=llava with a model.vision section, or a text data.kind",
            )
        )
    if arch is not None and arch.takes_images and not kind.images:
        out.append(
            Problem(
                "data.kind",
                f"'{kind.name}' has no images; arch '{arch.name}' trains on data.kind=energon "
                "(prepare a dataset with `recipes data prepare` or `recipes data make-synthetic-vlm`)",
            )
        )
    return out


def _blend_file(cfg: TrainingConfig) -> list[Problem]:
    """A blend file readable here: its shards exist, it was tokenized with data.tokenizer, and
    its ids fit the model's embedding (config/blend.py)."""
    path = cfg.data.path or ""
    if not os.path.isfile(path):
        return []  # where the ranks run only: launchers/inputs.py and the job's preflight look
    try:
        blend = read_blend_file(path)
        prefixes, _ = parse_blend(path)
    except ValueError as err:
        return [Problem("data.path", str(err))]
    out = []
    missing = [p for p in prefixes if not all(os.path.isfile(p + e) for e in (".bin", ".idx"))]
    if missing:
        out.append(
            Problem(
                "data.path",
                f"the blend file {path} names {len(missing)} shard(s) without their .bin/.idx "
                f"(first: {missing[0]}); tokenize again into the blend's folder, or fix the file",
            )
        )
    tok = cfg.data.tokenizer
    made_with = blend.get("tokenizer_sha256")
    if tok and made_with and os.path.exists(tok):
        try:
            digest = tokenizer_digest(tok)
        except FileNotFoundError:
            digest = None  # no tokenizer file in that folder: the tokenizer rule names it
        if digest is not None and digest != made_with:
            out.append(
                Problem(
                    "data.tokenizer",
                    f"{tok!r} is not the tokenizer {path} was made with (its files' sha256 "
                    f"{digest[:12]}..., the blend's {made_with[:12]}...): the ids would mean "
                    "other tokens. Give the tokenizer the data was tokenized with, or tokenize "
                    "again with this one",
                )
            )
    size, vocab = blend.get("vocab_size"), cfg.model.vocab_size
    if isinstance(size, int) and size > vocab:
        out.append(
            Problem(
                "model.vocab_size",
                f"{vocab}, but {path} was tokenized with a tokenizer of {size} ids: ids up to "
                f"{size - 1} would index past the embedding. Set model.vocab_size to at least "
                f"{size}",
            )
        )
    return out


def _stage_dir(stage_dir: str, kind: str) -> list[Problem]:
    """data.stage_dir: an absolute folder as the ranks see it, for an indexed blend."""
    if kind != "indexed":
        return [
            Problem(
                "data.stage_dir",
                f"copies an indexed blend's .bin/.idx files to node-local storage; "
                f"data.kind='{kind}' is read in place. Unset data.stage_dir (=None)",
            )
        ]
    if not stage_dir.startswith("/"):
        return [
            Problem(
                "data.stage_dir",
                f"{stage_dir!r} is not an absolute path; name a node-local folder such as "
                "/dev/shm/<you>/data or a node's local disk",
            )
        ]
    return []


def _evaluation(cfg: TrainingConfig) -> list[Problem]:
    """data.split's weights, and train.eval_interval's validation batches."""
    train, data, out = cfg.train, cfg.data, []
    kind = data_kind(cfg)
    try:
        weights = split_weights(data.split)
    except ValueError:
        out.append(
            Problem(
                "data.split",
                f"'{data.split}' is not up to three finite, non-negative weights for train, "
                "validation and test with a positive sum, e.g. data.split=969,30,1",
            )
        )
        weights = [1.0, 0.0, 0.0]
    if train.eval_interval <= 0 or kind is None:
        return out
    if not kind.has_validation:
        readable = ", ".join(k.name for k in DATA_KINDS.values() if k.has_validation)
        out.append(
            Problem(
                "train.eval_interval",
                f"evaluation reads the validation split of {readable} data; data.kind="
                f"'{kind.name}' has no validation loader here yet. Set train.eval_interval=0",
            )
        )
    elif kind.uses_split and weights[1] == 0:
        out.append(
            Problem(
                "data.split",
                f"'{data.split}' gives the validation split no weight, but train.eval_interval="
                f"{train.eval_interval} evaluates on it; e.g. data.split=969,30,1",
            )
        )
    return out


def has_chat_template(folder: Path) -> bool:
    """Whether the Hugging Face tokenizer folder carries a default chat template, where
    transformers looks for one: chat_template.jinja, or tokenizer_config.json's chat_template (a
    string, or a list of named templates with a "default" one)."""
    if (folder / "chat_template.jinja").is_file():
        return True
    try:
        template = read_json(folder / "tokenizer_config.json").get("chat_template")
    except (OSError, ValueError, AttributeError):
        return False
    if isinstance(template, list):
        return any(isinstance(t, dict) and t.get("name") == "default" for t in template)
    return isinstance(template, str) and bool(template.strip())


def _chat_template(given: str, kind: str) -> list[Problem]:
    """data.tokenizer of a kind that renders conversations: an HF folder with a chat template. A
    path that is not here is left to the launcher's input check (the ranks may see it elsewhere)."""
    path = Path(os.path.expanduser(given))
    if path.is_file():
        return [
            Problem(
                "data.tokenizer",
                f"'{given}' is a tokenizer file, but data.kind='{kind}' renders conversations "
                "with a chat template, which only a Hugging Face tokenizer folder carries; point "
                "data.tokenizer at the model's folder (tokenizer.json + tokenizer_config.json)",
            )
        ]
    if path.is_dir() and not has_chat_template(path):
        return [
            Problem(
                "data.tokenizer",
                f"'{given}' has no chat template (no chat_template in tokenizer_config.json, no "
                f"chat_template.jinja), which data.kind='{kind}' renders every conversation with. "
                "Point data.tokenizer at the instruct model's tokenizer folder, add the template "
                "there, or use data.kind=sft for prompt/response pairs",
            )
        ]
    return []


def _tokenizer_here(cfg: TrainingConfig) -> list[Problem]:
    """`tokenizer_fits` for data.tokenizer where this machine sees it as given. A path that is
    not here is the launcher's to look for where the ranks will see it (launchers/inputs.py)."""
    path = Path(os.path.expanduser(cfg.data.tokenizer or ""))
    return tokenizer_fits(cfg, tokenizer_size(path) if path.exists() else None)


def tokenizer_fits(cfg: TrainingConfig, size: int | None) -> list[Problem]:
    """data.tokenizer, which emits `size` ids (None: unknown), against model.vocab_size: ids past
    the embedding train on nothing under tensor parallelism, or fail deep inside the model. The
    checker (`data`) and the launcher (launchers/inputs.py) ask with the size read from the
    tokenizer's files (config/hf.py `tokenizer_size`), the ranks with the loaded tokenizer's
    (data/pretrain.py, data/sft.py): one check, one message."""
    given, vocab = cfg.data.tokenizer, cfg.model.vocab_size
    if size is None or size <= vocab:
        return []
    return [
        Problem(
            "data.tokenizer",
            f"{given} has {size} ids but model.vocab_size={vocab}: ids {vocab}..{size - 1} "
            "would fall outside the model's vocabulary. Use the model's own tokenizer, or raise "
            f"model.vocab_size to at least {size} (a model trained from scratch)",
        )
    ]


def check_tokenizer_fits(cfg: TrainingConfig, size: int) -> None:
    """`tokenizer_fits` on the ranks, with the loaded tokenizer's size: a ConfigError naming the
    field (training.entry exits 2 with it, as for any invalid config)."""
    problems = tokenizer_fits(cfg, size)
    if problems:
        raise ConfigError([(p.field, p.message) for p in problems])
