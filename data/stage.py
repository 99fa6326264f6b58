"""Copies of an indexed blend on node-local storage (data.stage_dir), made before training.

On each node, the rank with LOCAL_RANK 0 copies every local prefix's .bin and .idx into
data.stage_dir (config.blend.staged_prefix names the copies); every rank waits at a barrier of the
default group, then reads the copies. A copy is written under a temporary name and renamed when
complete, so a stopped copy is never read as data; a copy already there with the source's size
and modification time is kept (the next job of a chain on the same node). The copies keep the
source's modification time: Megatron's index caches are keyed by the files' path, size and mtime
(data/pretrain.py), so every node computes the same key and reads the same shared caches.
"""

from __future__ import annotations

import os
import shutil

from config.blend import staged_prefix

EXTENSIONS = (".bin", ".idx")


class StageError(OSError):
    """The copies cannot be made: names data.stage_dir, the sizes and the fix."""


def _current(src: str, dst: str) -> bool:
    if not os.path.isfile(dst):
        return False
    a, b = os.stat(src), os.stat(dst)
    return a.st_size == b.st_size and int(a.st_mtime) == int(b.st_mtime)


def copy_prefixes(prefixes: list[str], stage_dir: str) -> list[str]:
    """This node's copies of `prefixes` (made where missing or stale); the staged prefixes."""
    pairs = [
        (p + ext, staged_prefix(p, stage_dir) + ext)
        for p in prefixes
        if "://" not in p
        for ext in EXTENSIONS
    ]
    todo = [(src, dst) for src, dst in pairs if not _current(src, dst)]
    try:
        os.makedirs(stage_dir, exist_ok=True)
    except OSError as err:
        raise StageError(
            f"data.stage_dir={stage_dir!r} cannot be created on {os.uname().nodename}: {err}; "
            "name a node-local folder the job can write (/dev/shm/<you>/data, a local disk)"
        ) from err
    need = sum(os.path.getsize(src) for src, _ in todo)
    free = shutil.disk_usage(stage_dir).free
    if need > free:
        raise StageError(
            f"data.stage_dir={stage_dir!r} on {os.uname().nodename} has {free / 2**30:.2f} GiB "
            f"free, and the blend's files to copy take {need / 2**30:.2f} GiB: pick a larger "
            "node-local folder, or unset data.stage_dir to read the data in place"
        )
    for src, dst in todo:
        partial = f"{dst}.partial-{os.getpid()}"
        try:
            shutil.copy2(src, partial)  # copy2: the source's mtime, which the cache key reads
            os.replace(partial, dst)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    return [staged_prefix(p, stage_dir) for p in prefixes]


def stage_blend(prefixes: list[str], stage_dir: str) -> list[str]:
    """Every rank calls it: LOCAL_RANK 0 of each node copies, all wait for all, all get the staged
    prefixes, or all raise the first node's StageError (none is left waiting). Without a process
    group the caller copies for itself."""
    import torch.distributed as dist

    error = None
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        try:
            copy_prefixes(prefixes, stage_dir)
        except StageError as err:
            error = str(err)
    errors = [error]
    if dist.is_initialized():  # the barrier, carrying each rank's outcome
        errors = [None] * dist.get_world_size()
        dist.all_gather_object(errors, error)
    failed = [e for e in errors if e is not None]
    if failed:
        raise StageError(failed[0])
    return [staged_prefix(p, stage_dir) for p in prefixes]
