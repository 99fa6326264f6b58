"""The frozen base of a LoRA run: its files, recorded in each of the run's checkpoints and
compared when the run resumes.

A LoRA checkpoint holds the adapters alone; the base weights come from checkpoint.pretrained_dir
again at every start. Adapters trained on one base mean nothing on another, and a base changed in
place (one weight rescaled, another model's weights of the same names and shapes saved over it, a
newer checkpoint in a folder of checkpoints) would load without a word. So train_state.json keeps
a record of the base (`"lora_base"`: its folder, and each file's size and SHA-256), and a resume on
a base whose files differ is refused, naming them.

What the record costs:
- A Megatron checkpoint (`recipes import` writes one): nothing. Its manifest.json holds every file's
  size and SHA-256, hashed once when it was written, and the ranks verify the files against it
  whenever they load it (training/checkpoint/store.py); the manifest is the record.
- A Hugging Face folder: one streamed SHA-256 of config.json, the index and each safetensors file
  when the run starts and again when it resumes, shared out over the ranks as checkpoint
  verification is. That is one more read of the base, which the load then finds in the page cache.
  Sizes and safetensors headers alone would cost nothing, but they are the same after exactly the
  changes this is for (a rescaled weight, another model of the same shapes).

Before launch (launchers/resume.py) the launcher compares what it can without reading the weights:
every file's name and size, each safetensors header, the small files' bytes, and a checkpoint's
whole manifest. The ranks compare everything, before anything is loaded. Plain Python, no torch.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import Any

from config.hf import CONFIG_FILE, INDEX_FILE, is_hf_folder, safetensors_tensors
from config.schema import TrainingConfig
from training.checkpoint import dirs

RECORD = "lora_base"  # train_state.json's key
FIELD = "checkpoint.pretrained_dir"
SMALL = 2**20  # bytes: files at most this big are hashed whole before launch too


def applies(cfg: TrainingConfig) -> bool:
    """Whether the run's checkpoints hold adapters whose base comes from pretrained_dir."""
    return cfg.peft.scheme != "none" and bool(cfg.checkpoint.pretrained_dir)


def base_folder(pretrained_dir: str | Path) -> Path | None:
    """The folder the base weights are read from: a Hugging Face folder itself; a complete
    checkpoint, or the one `latest` names in a folder of them; None when there is none."""
    folder = Path(pretrained_dir)
    if is_hf_folder(folder):
        return folder
    if dirs.is_complete(folder):
        return folder
    return dirs.latest_checkpoint(folder) if folder.is_dir() else None


def base_files(folder: Path) -> list[str]:
    """The files that make the base: a Hugging Face folder's config.json, index and weight files;
    a checkpoint's, as its manifest lists them. ValueError naming an unreadable manifest."""
    if not is_hf_folder(folder):
        return sorted(dirs.read_manifest(folder))
    weights = sorted({file for file, _, _ in safetensors_tensors(folder).values()})
    index = [INDEX_FILE] if (folder / INDEX_FILE).is_file() else []
    return [CONFIG_FILE, *index, *weights]


def describe(folder: Path, names: list[str], whole: bool) -> dict[str, dict[str, Any]]:
    """What is known of each of `names` (files of `base_files`): its size, a safetensors file's
    header's SHA-256, and with `whole` (or a small file) the SHA-256 of all its bytes. A
    checkpoint's come from its manifest."""
    if not is_hf_folder(folder):
        manifest = dirs.read_manifest(folder)
        return {name: manifest[name] for name in names}
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        path = folder / name
        entry: dict[str, Any] = {"size": path.stat().st_size}
        if name.endswith(".safetensors"):
            entry["header"] = _header_digest(path)
        if whole or entry["size"] <= SMALL:
            entry["sha256"] = dirs.file_digests(folder, [name])[name]["sha256"]
        out[name] = entry
    return out


def _header_digest(path: Path) -> str:
    """SHA-256 of a safetensors file's length prefix and JSON header (names, dtypes, shapes)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        length = struct.unpack("<Q", raw)[0] if len(raw) == 8 else 0
        return hashlib.sha256(raw + f.read(min(length, 100 * 2**20))).hexdigest()


def record(folder: Path, files: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """train_state.json's record of the base."""
    return {"folder": str(folder.resolve()), "files": files}


def differing(saved: dict[str, dict[str, Any]], now: dict[str, dict[str, Any]]) -> list[str]:
    """Each file that differs between two records, and how: gone, new, another size or other
    bytes (by whatever both records know of it)."""
    out = []
    for name in sorted(saved.keys() | now.keys()):
        old, new = saved.get(name), now.get(name)
        if new is None:
            out.append(f"{name} (gone)")
        elif old is None:
            out.append(f"{name} (new)")
        elif old["size"] != new["size"]:
            out.append(f"{name} ({old['size']} bytes, now {new['size']})")
        elif any(k in old and k in new and old[k] != new[k] for k in ("header", "sha256")):
            out.append(f"{name} (other bytes, same size)")
    return out


def problem(
    saved: dict[str, Any], folder: Path, now: dict[str, dict[str, Any]], checkpoint: Path
) -> tuple[str, str] | None:
    """ConfigError's (field, message) when the base at `folder` (described by `now`) is not the
    one the checkpoint recorded; None when nothing differs that both know of."""
    files = differing(saved["files"], now)
    if not files:
        return None
    shown = ", ".join(files[:5]) + (f" and {len(files) - 5} more" if len(files) > 5 else "")
    count = "1 of its files differs" if len(files) == 1 else f"{len(files)} of its files differ"
    then = f" (in {saved['folder']})" if saved["folder"] != str(folder) else ""
    return (
        FIELD,
        f"{folder} is not the base the LoRA adapters in {checkpoint} were trained on{then}: "
        f"{count}: {shown}. Adapters fit only the base they were trained with: point {FIELD} at "
        "that base (restore it, or a copy), or train new adapters in a new logging.run_dir (or "
        "checkpoint.save_dir)",
    )
