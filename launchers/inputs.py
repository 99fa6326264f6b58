"""The files a run will read, looked for on this machine before anything is launched or queued.

A typo in data.path, data.tokenizer or checkpoint.pretrained_dir otherwise surfaces only when the
job starts, after its wait in the queue. `check_inputs` refuses the launch instead, naming the field
and the missing path:

- data.tokenizer: a file or folder; data.path: what the data kind's registry entry says it names
  (config/registry.py: for `indexed` each blend prefix's .bin and .idx, object storage left to
  Megatron; for `sft` the JSONL file; for `energon` the prepared folder or metadataset file);
  checkpoint.load_dir and .pretrained_dir. An SFT or chat file is also read through, line by
  line, as the ranks will read it (data/records.py): a bad line is named here, once.
- The ranks see these paths as given: locally and with slurm-bare relative to their working
  directory (the profile's `workdir`, else the directory `recipes run` was started in); in a
  container through the profile's mounts, which map them back to the host to look at, except
  checkpoint.load_dir, which the Slurm launcher takes as a host path and maps in itself.
- checkpoint.pretrained_dir: a Megatron checkpoint or a local Hugging Face folder, never a hub id
  to download (a missing "Qwen/Qwen3-8B" is a missing path like any other). A Hugging Face folder
  must match the model section: the checker's rule (config/rules/pretrained.py) compares them
  where the path is seen as given, and `check_inputs` again at the host path the mounts map it to.
- data.tokenizer must fit the model: a tokenizer with more ids than model.vocab_size is refused
  (ids past the embedding train silently on nothing under tensor parallelism). Its size is read
  from its tokenizer.json (config/hf.py `tokenizer_size`), without torch, and judged by the
  rule the ranks apply to the tokenizer they load (config/rules/data.py `tokenizer_fits`). The
  checker asks where the path is seen as given; this check again where the ranks will see it.
- What cannot be seen from here is left to a Slurm job: a path inside the container image (no
  mount covers it), a relative path in a container without `workdir`, or a filesystem this machine
  does not have at all (the path's first component is missing, e.g. a compute node's local /raid).
  The local executor's ranks run here: a path missing here is missing for them.
- The local executor also needs logging.run_dir, checkpoint.save_dir and the indexed data's index
  cache folder (data.index_cache_dir, else beside the data) writable or creatable under their
  nearest existing folder, and W&B importable when logging.wandb_project asks for it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path, PurePosixPath

from config.blend import index_cache_base, parse_blend
from config.hf import tokenizer_size
from config.rules.data import tokenizer_fits
from config.rules.pretrained import pretrained_problems
from config.schema import TrainingConfig, data_kind
from config.tree import ConfigError
from data.records import SFTDataError, read_conversations, read_pairs
from launchers.mounts import HOST_CHECKPOINT_FIELDS, parse_mounts, to_host
from launchers.profile import Profile
from training.inprocess import INPROCESS_FIX, INPROCESS_IMPORT


def input_paths(cfg: TrainingConfig) -> list[tuple[str, str]]:
    """(field, path) of every file or folder the ranks read, as the config gives them."""
    data, ckpt = cfg.data, cfg.checkpoint
    out = []
    if data.tokenizer:
        out.append(("data.tokenizer", data.tokenizer))
    kind = data_kind(cfg)
    if data.path and kind is not None:  # the files its data.path names (config/registry.py)
        try:
            out += [("data.path", path) for path in kind.inputs(data.path)]
        except ValueError:
            pass  # a data.path the kind cannot read: the checker has refused it already
    for field in ("load_dir", "pretrained_dir"):
        if getattr(ckpt, field):
            out.append((f"checkpoint.{field}", getattr(ckpt, field)))
    return out


def _where_to_look(field: str, path: str, profile: Profile, cwd: Path) -> Path | None:
    """This machine's path for what the ranks will open, or None when it cannot be seen here."""
    path = os.path.expanduser(path)
    host_given = field.removeprefix("checkpoint.") in HOST_CHECKPOINT_FIELDS
    if profile.containerised and not host_given:
        if not PurePosixPath(path).is_absolute():
            if not profile.workdir:
                return None
            path = str(PurePosixPath(profile.workdir) / path)
        host = to_host(path, parse_mounts(profile.mounts))
        if host is None:
            return None
        path = host
    elif not os.path.isabs(path):
        path = os.path.join(profile.workdir or cwd, path)
    parts = PurePosixPath(path).parts
    remote = profile.executor != "local"  # the local executor's ranks run on this machine
    if remote and len(parts) > 1 and not Path(parts[0], parts[1]).exists():
        return None  # a filesystem this machine does not mount
    return Path(path)


def check_inputs(cfg: TrainingConfig, profile: Profile, cwd: Path) -> None:
    """ConfigError naming each input that the ranks would not find."""
    problems = []
    for field, given in input_paths(cfg):
        here = _where_to_look(field, given, profile, cwd)
        if here is None:
            continue
        if here.exists():
            if field == "checkpoint.pretrained_dir":
                problems += [
                    (p.field, p.message) for p in pretrained_problems(cfg.model, here, given)
                ]
            elif field == "data.path" and cfg.data.kind in RECORD_READERS:
                problems += _records_parse(cfg.data.kind, here)
            continue
        seen = f" (on this machine {here})" if str(here) != given else ""
        hub = (
            "; it takes a local Megatron checkpoint or Hugging Face folder, nothing is "
            "downloaded from a hub (download the folder first, e.g. with `hf download`)"
            if field == "checkpoint.pretrained_dir"
            else ""
        )
        problems.append(
            (
                field,
                f"{given} does not exist{seen}: the ranks would fail at start-up (a Slurm job "
                f"after its wait in the queue). Fix the path, or create it first{hub}",
            )
        )
    problems += _tokenizer_fits(cfg, profile, cwd)
    if profile.executor == "local":  # what the ranks write and import, on this machine
        problems += _writable(cfg, profile, cwd) + _packages(cfg)
    if problems:
        raise ConfigError(problems)


RECORD_READERS = {"sft": read_pairs, "chat": read_conversations}


def _records_parse(kind: str, path: Path) -> list[tuple[str, str]]:
    """data.path of an SFT or chat run read line by line as the ranks will read it: the first bad
    line (not UTF-8, not JSON, a missing key, an empty answer), or a file with no record at all."""
    try:
        count = sum(1 for _ in RECORD_READERS[kind](path))
    except (SFTDataError, OSError) as err:  # ChatDataError is one; a folder is an OSError
        return [("data.path", f"{err} (the ranks would fail reading it after start-up)")]
    if count == 0:
        return [("data.path", f"{path} holds no {kind} record: it is empty or blank")]
    return []


def _writable(cfg: TrainingConfig, profile: Profile, cwd: Path) -> list[tuple[str, str]]:
    """The folders the ranks write: each must be writable where it is, or creatable under its
    nearest existing parent."""
    out = []
    run_root = cfg.logging.run_dir or profile.run_root or "runs"
    folders = [
        ("logging.run_dir", run_root, "pick a folder you can write to"),
        ("checkpoint.save_dir", cfg.checkpoint.save_dir, "pick a folder you can write to"),
    ]
    if data_kind(cfg) is not None and cfg.data.kind == "indexed" and cfg.data.path:
        with contextlib.suppress(ValueError):  # a data.path the checker has refused already
            cache = index_cache_base(parse_blend(cfg.data.path)[0], cfg.data.index_cache_dir)
            fix = (
                "pick a folder you can write to"
                if cfg.data.index_cache_dir
                else "the index caches go beside the data by default: for read-only data set "
                "data.index_cache_dir to a folder you can write to (e.g. under the run directory)"
            )
            folders.append(("data.index_cache_dir", cache, fix))
    for field, given, fix in folders:
        if not given:
            continue
        path = Path(os.path.expanduser(given))
        path = path if path.is_absolute() else cwd / path
        existing = next(p for p in (path, *path.parents) if p.exists())
        if existing.is_dir() and os.access(existing, os.W_OK | os.X_OK):
            continue
        what = "is not writable" if existing == path else f"cannot be created in {existing}"
        out.append(
            (
                field,
                f"{given} {what} (the ranks would fail writing {field.split('.')[-1]} after "
                f"start-up); {fix}",
            )
        )
    return out


def _packages(cfg: TrainingConfig) -> list[tuple[str, str]]:
    """Optional packages the config asks for, importable here (the local ranks' environment)."""
    import importlib.util

    out = []
    if cfg.logging.wandb_project and cfg.logging.wandb_mode != "disabled":
        if importlib.util.find_spec("wandb") is None:
            out.append(
                (
                    "logging.wandb_project",
                    f"is {cfg.logging.wandb_project!r} but wandb is not installed; install it "
                    "(pip install wandb) or unset logging.wandb_project",
                )
            )
    if cfg.resilience.inprocess_restart:
        why = inprocess_import_error()
        if why is not None:
            out.append(
                (
                    "resilience.inprocess_restart",
                    f"is true, but the ranks' Python cannot import nvidia-resiliency-ext's "
                    f"in-process restart with megatron-core ({why}); " + INPROCESS_FIX,
                )
            )
    return out


def inprocess_import_error() -> str | None:
    """Why this Python cannot import nvidia_resiliency_ext.inprocess beside megatron-core, or None.
    A subprocess: the check stays torch-free, and it sees 0.4.1 break megatron-core's import."""
    import importlib.util

    if importlib.util.find_spec("nvidia_resiliency_ext") is None:
        return "nvidia_resiliency_ext is not installed"
    try:
        done = subprocess.run(
            [sys.executable, "-c", INPROCESS_IMPORT], capture_output=True, text=True, timeout=300
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{sys.executable} could not run: {err}"
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]


def _tokenizer_fits(cfg: TrainingConfig, profile: Profile, cwd: Path) -> list[tuple[str, str]]:
    """The checker's tokenizer rule, with the size of data.tokenizer as the ranks will find it."""
    given = cfg.data.tokenizer
    here = _where_to_look("data.tokenizer", given, profile, cwd) if given else None
    size = tokenizer_size(here) if here is not None and here.exists() else None
    return [(p.field, p.message) for p in tokenizer_fits(cfg, size)]
