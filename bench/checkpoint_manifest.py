"""What the checkpoint manifest costs: hashing a 1B-shaped checkpoint at save and again at resume.

    .venv/bin/python bench/checkpoint_manifest.py [--params 1.24e9] [--ranks 8] [--dir /tmp/x]

A checkpoint of a model with P parameters, saved with the distributed optimizer, holds about
14 bytes per parameter: BF16 weights (2) and the FP32 main weights with Adam's two moments (12).
This writes that many bytes as one shard file per rank (Megatron's `__<rank>_0.distcp` layout,
random bytes), then times `training.checkpoint.dirs.file_digests` on it the way the checkpointer
calls it: every rank hashes its share of the files (files[rank::ranks]), all ranks at once. Here
`--workers` processes (default: the machine's cores, at most --ranks) stand in for the ranks; the
time per rank is what a save or a resume waits for when every rank has a core of its own.
Files are hashed twice: right after writing (in the page cache, as at save time) and after
dropping the page cache where that is allowed (as a resume on a fresh node reads them).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.checkpoint.dirs import checkpoint_files, file_digests  # noqa: E402

BYTES_PER_PARAM = 14
CHUNK = 64 * 2**20


def write_shards(folder: Path, total: int, ranks: int) -> None:
    block = os.urandom(CHUNK)
    for rank in range(ranks):
        left = total // ranks
        with open(folder / f"__{rank}_0.distcp", "wb") as f:
            while left > 0:
                f.write(block[: min(left, CHUNK)])
                left -= CHUNK


def share(args: tuple[str, list[str]]) -> float:
    folder, names = args
    start = time.perf_counter()
    file_digests(Path(folder), names)
    return time.perf_counter() - start


def hash_all(folder: Path, ranks: int, workers: int) -> tuple[float, float]:
    """(wall time of all shares, the longest share's time), `workers` shares at a time."""
    files = checkpoint_files(folder)
    shares = [(str(folder), files[r::ranks]) for r in range(ranks)]
    start = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        per_share = list(pool.map(share, shares))
    return time.perf_counter() - start, max(per_share)


def drop_page_cache() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=float, default=1.24e9, help="Llama 3.2 1B: 1.24e9")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp folder)")
    args = parser.parse_args()
    workers = args.workers or min(args.ranks, os.cpu_count() or 1)
    total = int(args.params * BYTES_PER_PARAM)
    folder = Path(tempfile.mkdtemp(prefix="manifest-bench-", dir=args.dir))
    try:
        start = time.perf_counter()
        write_shards(folder, total, args.ranks)
        written = time.perf_counter() - start
        gb = total / 1e9
        print(f"checkpoint: {gb:.1f} GB in {args.ranks} shards, written in {written:.1f} s")
        for label, ready in (("cached", True), ("from disk", drop_page_cache())):
            if not ready:
                print(f"{label}: cannot drop the page cache here (not root): skipped")
                continue
            wall, per_rank = hash_all(folder, args.ranks, workers)
            print(
                f"{label}: {workers} processes hashed {gb:.1f} GB in {wall:.1f} s "
                f"({gb / wall:.2f} GB/s); one rank's share ({gb / args.ranks:.2f} GB) took "
                f"{per_rank:.2f} s ({gb / args.ranks / per_rank:.2f} GB/s per process)"
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
