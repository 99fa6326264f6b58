"""What `recipes import` (training/hf/importer.py) and `recipes export` (training/hf/exporter.py) share.

Both stream, holding about one layer's tensors at a time (bench/hf_convert.py measures it), write
into a temporary sibling of their output folder and rename it at the end (`writing`: a failed or
interrupted run leaves no half folder under the name asked for, and a full disk is named), and
report progress on stderr. A file copied as it is from a folder someone else made (tokenizer files,
configs, the origin's weights) must be a regular file inside that folder (`foreign_file`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from models.hf.safetensors_io import HfWeights
from training.checkpoint import dirs

EXTRA = "hf_extra."  # import: Hugging Face tensors the model does not hold
LAYER_KEY = re.compile(r"(.*\blayers)\.(\d+)\.(.*)")


class ConvertError(ValueError):
    """A named problem with the input (exit 2)."""


# --- shared ---------------------------------------------------------------------------------------
def progress(label: str, total: int) -> Callable[[int], None]:
    """A one-line progress report on stderr: `label: i/total tensors`."""
    start = time.perf_counter()

    def report(done: int) -> None:
        if done == total or done % max(1, total // 10) == 0:
            took = time.perf_counter() - start
            print(f"{label}: {done}/{total} tensors ({took:.1f} s)", file=sys.stderr, flush=True)

    return report


@contextlib.contextmanager
def writing(out: Path) -> Iterator[Path]:
    """A temporary sibling of `out` to write into (`fresh_output`), renamed to `out` when the block
    ends. When it fails the sibling is removed, so that nothing under `out` looks complete, and a
    full disk (training/checkpoint/dirs.py `disk_full`) is a ConvertError naming `out`."""
    tmp = fresh_output(out)
    try:
        yield tmp
    except BaseException as err:
        # Asked before the partial output goes: the probe must meet the disk as it was.
        stopped = isinstance(err, KeyboardInterrupt | SystemExit | ConvertError)
        full = not stopped and dirs.disk_full(err, out.parent)
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise ConvertError(
                f"No space left on device writing {out} ({dirs.free_space(out.parent)} there); "
                "what was written is removed, nothing is left under that name. Free space, or "
                "give a folder on another disk, then run again"
            ) from err
        raise
    finish(tmp, out)


def fresh_output(out: Path) -> Path:
    """A temporary sibling of `out`, renamed to it at the end: a failed run leaves no half folder."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConvertError(
            f"{out} exists and is not empty; give a new folder (nothing is replaced)"
        )
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def foreign_file(folder: Path, name: str) -> Path | None:
    """The file `folder/name` of a folder someone else made, to copy into an export as it is:
    its real path, or None when there is none. A symbolic link that leads out of `folder` (to a
    private file that the export would then carry), or anything but a regular file, is a
    ConvertError naming it. huggingface_hub's cache links each file of a snapshot to its blob,
    `snapshots/<rev>/<name> -> ../../blobs/<hash>`: such a blob counts as inside."""
    path = folder / name
    if not path.exists() and not path.is_symlink():
        return None
    fix = (
        "an export copies such files as they are; put the file itself there (not a link) if it is "
        "meant to travel with the model, or remove it, then export again"
    )
    try:
        target = path.resolve(strict=True)
    except (OSError, RuntimeError) as err:  # dangling, or a loop of links
        raise ConvertError(f"{path} is a symbolic link that leads nowhere ({err}); {fix}") from None
    root = folder.resolve()
    inside = [root]
    blobs = root.parent.parent / "blobs"
    if root.parent.name == "snapshots" and blobs.is_dir() and not blobs.is_symlink():
        inside.append(blobs)
    if not any(target.is_relative_to(r) for r in inside):
        raise ConvertError(f"{path} is a symbolic link to {target}, outside {folder}; {fix}")
    if not target.is_file():
        raise ConvertError(f"{path} is not a regular file; {fix}")
    return target


def copy_foreign(folder: Path, name: str, dest: Path) -> bool:
    """Copy `folder/name`, checked by `foreign_file`, to the file `dest` unless that exists
    already; whether it was copied."""
    source = foreign_file(folder, name)
    if source is None or dest.exists():
        return False
    shutil.copyfile(source, dest)
    return True


def finish(tmp: Path, out: Path) -> None:
    if out.exists():
        out.rmdir()  # empty, checked at the start
    os.replace(tmp, out)


def per_layer_key(key: str) -> tuple[str, int | None]:
    """`...layers.3.x` -> (`...layers.x`, 3), the key of the stacked form; others unchanged."""
    match = LAYER_KEY.fullmatch(key)
    if match is None:
        return key, None
    return f"{match[1]}.{match[3]}", int(match[2])


def iter_tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a Hugging Face folder (for tests and the benchmark)."""
    weights = HfWeights(folder)
    try:
        for name in sorted(weights.tensors):
            yield name, weights.read(name)
    finally:
        weights.close()
