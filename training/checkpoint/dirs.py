"""The checkpoint folder on disk: names, the `latest` pointer, atomic publication and pruning.

Plain Python (no torch, no process groups): global rank 0 calls these, and tests call them directly.

    <save_dir>/
      latest                 "iter_0000020": the newest complete checkpoint (written atomically)
      iter_0000020/          complete: Megatron's dist-checkpoint files, rng/rank_XXXXX.pt,
                             train_state.json (step, data position, LR schedule, config hash) and
                             manifest.json (every other file's size and SHA-256), written last
      iter_0000030.tmp/      being written, or left behind by a crash: never loaded, removed at start

A checkpoint is complete once its folder carries the plain `iter_XXXXXXX` name. Everything is
written into `iter_XXXXXXX.tmp` first, `train_state.json` last, and only then does rank 0 rename the
folder (an atomic `rename(2)` on one file system) and point `latest` at it. A crash or SIGKILL at any
moment therefore leaves either the previous complete checkpoint as the newest one, or the new one
complete; never a half-written folder under a name that the loader accepts.

What a crash cannot do, a disk, a copy or a hand can: flip bytes, truncate a shard, delete a file.
`manifest.json` lets a resume find that out before it loads anything (training/checkpoint/store.py hashes
and verifies it, each rank a share of the files) and fall back to an older checkpoint that passes.
`latest` names a folder of its own directory only: anything else in it is ignored and reported.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from config.hf import parse_json

# train_state.json's dist_optimizer_sharding of a Megatron-FSDP checkpoint (Megatron-Core's name).
from config.layout import FSDP_SHARDING as FSDP_SHARDING

LATEST_FILE = "latest"
STATE_FILE = "train_state.json"
MANIFEST_FILE = "manifest.json"
TMP_SUFFIX = ".tmp"  # being written
DEL_SUFFIX = ".del"  # being deleted: renamed first, so a half-deleted folder never looks complete
_COMPLETE = re.compile(r"^iter_(\d{7,})$")


def iter_name(step: int) -> str:
    return f"iter_{step:07d}"


def step_of(path: Path) -> int | None:
    """The step of a complete checkpoint folder's name; None for anything else (.tmp, files)."""
    match = _COMPLETE.match(path.name)
    return int(match.group(1)) if match else None


def is_complete(path: Path) -> bool:
    return step_of(path) is not None and (path / STATE_FILE).is_file()


def complete_checkpoints(save_dir: Path) -> list[Path]:
    """Complete checkpoint folders under save_dir, oldest first."""
    if not save_dir.is_dir():
        return []
    found = [p for p in save_dir.iterdir() if p.is_dir() and is_complete(p)]
    return sorted(found, key=lambda p: step_of(p) or 0)


def resume_candidates(save_dir: Path) -> tuple[list[Path], list[str]]:
    """The checkpoints to try, in order, and what was wrong with `latest` (for the log).

    First the one `latest` names, when it is complete: it wins over a newer folder so that a user
    can roll back by editing it (as with Megatron-LM's latest_checkpointed_iteration.txt); then the
    older complete ones, newest first, to fall back on when it turns out damaged. Without a usable
    `latest` (deleted, garbled, naming something that is not an iter_XXXXXXX folder of save_dir, or a
    crash between the rename and its update) every complete folder, newest first; `.tmp` never.
    """
    complete = complete_checkpoints(save_dir)
    notes: list[str] = []
    pointer = save_dir / LATEST_FILE
    if pointer.is_file():
        try:
            name = pointer.read_bytes().decode("utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            name, why = None, f"cannot be read ({err})"
        else:
            why = f"names {name!r}, not a complete checkpoint folder of {save_dir}"
        if name is not None and _COMPLETE.match(name) and is_complete(save_dir / name):
            named = save_dir / name
            newest = step_of(named) or 0
            return [named, *[p for p in reversed(complete) if (step_of(p) or 0) < newest]], notes
        notes.append(f"{pointer} {why}: ignored")
    return list(reversed(complete)), notes


def latest_checkpoint(save_dir: Path) -> Path | None:
    """The checkpoint a resume tries first (see `resume_candidates`)."""
    candidates, _ = resume_candidates(save_dir)
    return candidates[0] if candidates else None


def _fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in `path` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write-to-temp, fsync, os.replace: readers see the old content or the new, never a part."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def write_state(folder: Path, state: dict[str, Any]) -> None:
    atomic_write_text(folder / STATE_FILE, json.dumps(state, indent=1, sort_keys=True) + "\n")


def read_state(folder: Path) -> dict[str, Any]:
    """A checkpoint's train_state.json; ValueError, naming the file, when it is empty, not JSON
    or not a JSON object (damage that a checkpoint is passed over for, as any other)."""
    path = folder / STATE_FILE
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ValueError(f"{path} cannot be read ({err})") from None
    if not data:
        raise ValueError(f"{path} is empty (0 bytes)")
    state = parse_json(data, path)
    if not isinstance(state, dict):
        raise ValueError(f"{path} is a JSON {type(state).__name__}, not an object")
    return state


def resume_state(save_dir: Path) -> tuple[tuple[Path, dict[str, Any]] | None, list[str]]:
    """The checkpoint a resume starts from, by its train_state.json, and why each newer one was
    passed over: `resume_candidates` in order, skipping those whose train_state.json `read_state`
    refuses, as the ranks' resume does (which also checks every file against the manifest)."""
    candidates, _ = resume_candidates(save_dir)
    passed: list[str] = []
    for path in candidates:
        try:
            return (path, read_state(path)), passed
        except ValueError as err:
            passed.append(str(err))
    return None, passed


def checkpoint_files(folder: Path) -> list[str]:
    """Every file of a checkpoint folder but the manifest, as sorted POSIX paths relative to it."""
    found = (p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)
    return sorted(p.relative_to(folder).as_posix() for p in found)


def file_digests(folder: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """Size and SHA-256 of each of `names` (paths relative to folder)."""
    out = {}
    for name in names:
        with open(folder / name, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        out[name] = {"size": (folder / name).stat().st_size, "sha256": digest}
    return out


def write_manifest(folder: Path, files: dict[str, dict[str, Any]]) -> None:
    manifest = {"algorithm": "sha256", "files": files}
    atomic_write_text(folder / MANIFEST_FILE, json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def read_manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """The manifest's files; ValueError, naming the file, when it is missing or unreadable."""
    path = folder / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_bytes().decode("utf-8"))
        files = manifest["files"]
        if manifest["algorithm"] != "sha256" or not isinstance(files, dict):
            raise ValueError("unknown layout")
        return files
    except FileNotFoundError:
        raise ValueError(
            f"{path} is missing (a checkpoint of an older format, or damaged)"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is unreadable ({type(err).__name__}: {err})") from None


def verify_files(folder: Path, files: dict[str, dict[str, Any]], names: list[str]) -> list[str]:
    """What is wrong with `names` (a share of the manifest's files): missing, resized, changed."""
    problems = []
    for name in names:
        path, want = folder / name, files[name]
        if not path.is_file():
            problems.append(f"{path} is missing")
            continue
        size = path.stat().st_size
        if size != want["size"]:
            problems.append(f"{path} has {size} bytes, the manifest says {want['size']}")
        elif file_digests(folder, [name])[name]["sha256"] != want["sha256"]:
            problems.append(f"{path} does not match its SHA-256 in the manifest (changed bytes)")
    return problems


def _remove(path: Path) -> None:
    """Rename out of the complete namespace first, then delete (a crash mid-delete stays harmless)."""
    doomed = path.with_name(path.name + DEL_SUFFIX)
    if doomed.exists():
        shutil.rmtree(doomed, ignore_errors=True)
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def publish(tmp_folder: Path) -> Path:
    """Rename a fully written `iter_XXXXXXX.tmp` to `iter_XXXXXXX` and point `latest` at it."""
    written = all((tmp_folder / name).is_file() for name in (STATE_FILE, MANIFEST_FILE))
    if not tmp_folder.name.endswith(TMP_SUFFIX) or not written:
        raise ValueError(
            f"{tmp_folder} is not a fully written checkpoint (no {STATE_FILE} or {MANIFEST_FILE})"
        )
    final = tmp_folder.with_name(tmp_folder.name[: -len(TMP_SUFFIX)])
    if final.exists():
        # Left by a run that crashed after the rename but before `latest` moved on, then
        # resumed from an older one: this run's newer state replaces it.
        _remove(final)
    os.rename(tmp_folder, final)
    _fsync_dir(final.parent)
    atomic_write_text(final.parent / LATEST_FILE, final.name + "\n")
    return final


def prune(save_dir: Path, keep_last: int) -> list[Path]:
    """Remove all but the newest `keep_last` complete checkpoints (0 keeps all); returns the removed.

    The one `latest` names is always kept, even when a user rolled `latest` back.
    """
    if keep_last <= 0:
        return []
    keep = latest_checkpoint(save_dir)
    removed = []
    for path in complete_checkpoints(save_dir)[:-keep_last]:
        if path != keep:
            _remove(path)
            removed.append(path)
    return removed


def clean_stale(save_dir: Path) -> list[Path]:
    """Remove `.tmp` and `.del` folders left by crashed runs (call before this run saves anything)."""
    if not save_dir.is_dir():
        return []
    stale = [p for p in save_dir.iterdir() if p.name.endswith((TMP_SUFFIX, DEL_SUFFIX))]
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stale


FULL = (errno.ENOSPC, errno.EDQUOT)
# How writers that are not Python's own say the disk is full: torch's zip writer (torch.save) makes
# a short write and reports where it stopped ("unexpected pos 704 vs 598") or that the write failed;
# others (safetensors' Rust, C++ libraries) carry the system's own words in their message.
FULL_MESSAGES = ("unexpected pos", "file write failed", *map(os.strerror, FULL))


def disk_full(err: BaseException, folder: Path) -> bool:
    """Whether a full disk (or quota) is behind a failed write: an OSError with ENOSPC or EDQUOT,
    or a message of FULL_MESSAGES, in the error's chain (causes, contexts, and the per-rank
    failures that torch's checkpoint errors carry); else, since Megatron-Core's writer re-raises
    its workers' errors as bare class names, by writing 1 MiB into `folder` now."""
    seen: set[int] = set()
    todo: list[BaseException] = [err]
    while todo:
        error = todo.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in FULL:
            return True
        if any(words in str(error) for words in FULL_MESSAGES):
            return True
        failures = getattr(error, "failures", None)  # torch's CheckpointException
        if isinstance(failures, dict):
            todo += [f[0] for f in failures.values() if isinstance(f, tuple) and f]
        todo += [e for e in (error.__cause__, error.__context__) if e is not None]
    probe = folder / f".space-probe.{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * 2**20)
            f.flush()
            os.fsync(f.fileno())
    except OSError as probe_err:
        return probe_err.errno in FULL
    finally:
        probe.unlink(missing_ok=True)
    return False


def free_space(folder: Path) -> str:
    """`folder`'s free space, for a message ("1.25 GiB free")."""
    try:
        return f"{shutil.disk_usage(folder).free / 2**30:.2f} GiB free"
    except OSError:
        return "free space unknown"


LOCK_FILE = ".run.lock"


class FolderInUse(RuntimeError):
    """Another live run holds the run directory or the checkpoint folder."""


class RunLock:
    """One run per folder: a POSIX record lock (fcntl.lockf) on folder/.run.lock.

    The kernel drops the lock when its holder dies, however it dies, so a crashed run never leaves
    the folder locked; lockf's record locks also work across the nodes of an NFS or Lustre mount
    that supports them (`flock` would not on NFS). The file names the holder (host, pid, run
    directory, recipe, start time) for the message a second run gets. Where the filesystem refuses
    locks altogether, nothing is locked and the run says so.
    """

    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK_FILE
        self._file: Any = None

    def acquire(self, holder: dict[str, Any]) -> str | None:
        """Take the lock; returns None, or why the folder cannot be used (FolderInUse's text)."""
        import fcntl

        handle = self.path.open("a+", encoding="utf-8")
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            handle.seek(0)
            text = handle.read().strip()
            handle.close()
            if err.errno in (errno.EACCES, errno.EAGAIN):
                return f"{self.path.parent} is in use by another run ({text or 'unknown holder'})"
            return None  # no locks on this filesystem: run unlocked (see the docstring)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(holder) + "\n")
        handle.flush()
        self._file = handle
        return None

    def holder(self) -> str | None:
        """Who holds the lock now, or None (tried and given back at once: the launch check)."""
        if not self.path.is_file():
            return None
        problem = self.acquire({})
        self.release()
        return problem

    def release(self) -> None:
        if self._file is not None:
            import fcntl

            fcntl.lockf(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


class RunFolders:
    """The folders a run writes into, each held with a RunLock for as long as it runs: its run
    directory (config.yaml, metrics.jsonl, TensorBoard, W&B's id) and its checkpoint folder.

    A second run in either would overwrite the first's config and cut its metrics back to its own
    steps, or resume the first's state, delete its saves in progress and prune its checkpoints.
    The launcher asks `busy` before launch (exit 2) and the ranks `acquire` before they write
    anything; both answer with the same (field, message) pairs. One folder that is both (save_dir
    set to the run directory) has one lock: a process that opened the same lock file twice would
    lose its lock on closing either handle.
    """

    def __init__(self, run_dir: Path, save_dir: Path) -> None:
        self.locks: dict[str, RunLock] = {}
        seen: set[str] = set()
        for field, folder in (("logging.run_dir", run_dir), ("checkpoint.save_dir", save_dir)):
            real = os.path.realpath(folder)
            if real not in seen:
                seen.add(real)
                self.locks[field] = RunLock(Path(folder))

    @staticmethod
    def _refusal(field: str, problem: str) -> tuple[str, str]:
        other = " (or checkpoint.save_dir)" if field == "checkpoint.save_dir" else ""
        fix = f"wait for it to end, or give this run its own logging.run_dir{other}"
        return field, f"{problem}; {fix}"

    def acquire(self, holder: dict[str, Any]) -> list[tuple[str, str]]:
        """Make the folders and take their locks: [] when this run holds them all now, else
        (field, why and the fix) for each folder another live run holds, and none is kept."""
        problems = []
        for field, lock in self.locks.items():
            lock.path.parent.mkdir(parents=True, exist_ok=True)
            problem = lock.acquire(holder)
            if problem is not None:
                problems.append(self._refusal(field, problem))
        if problems:
            self.release()
        return problems

    def busy(self) -> list[tuple[str, str]]:
        """`acquire`'s answer without keeping a lock or making a folder (the launch check)."""
        found = []
        for field, lock in self.locks.items():
            problem = lock.holder() if lock.path.parent.is_dir() else None
            if problem is not None:
                found.append(self._refusal(field, problem))
        return found

    def release(self) -> None:
        for lock in self.locks.values():
            lock.release()
