"""`python -m training.entry` with a probe: peak memory and the wall time of every step, hooks included.

    torchrun --standalone --nproc-per-node 1 bench/gpu_rank.py --probe PROBE.json [--no-final-save] \
        --config CFG.yaml

--no-final-save: the run ends without the checkpoint the engine writes after its last step (a
benchmark of a multi-billion-parameter cut would otherwise write tens of GB at the end).

The engine runs unchanged; the probe wraps Trainer._log (called once per step, after the timed
step and before the hooks that save checkpoints) to take the wall clock, so the interval between
two records holds a step, its logging and whatever the hooks did (a checkpoint save's blocking
part). At the end rank 0 writes PROBE.json: peak allocated and reserved GiB on the GPU
(torch.cuda.max_memory_*), the process's peak RSS, the record times and the engine's exit code.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def peaks() -> dict[str, float | None]:
    """Peak memory of this process: the CUDA caching allocator's, and the host's RSS."""
    import torch

    rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        none = dict.fromkeys(("peak_allocated_gib", "peak_reserved_gib", "device_used_gib"))
        return none | {"peak_rss_gib": rss_gib}
    free, total = torch.cuda.mem_get_info()
    return {
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        # What the GPU holds at the end, CUDA context included (the cache still holds the peak
        # reserved unless it was emptied): the figure closest to what `recipes check` predicts.
        "device_used_gib": (total - free) / 2**30,
        "peak_rss_gib": rss_gib,
    }


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--probe":
        sys.exit("usage: gpu_rank.py --probe PROBE.json <training.entry arguments>")
    probe, rest = Path(argv[1]), argv[2:]
    from training import engine, entry
    from training.checkpoint import store as checkpoint

    if rest[:1] == ["--no-final-save"]:
        rest = rest[1:]
        checkpoint.Checkpointer.at_end = lambda self, trainer: self.close()

    marks: list[float] = []
    original = engine.Trainer._log

    def timed_log(self: Any, *args: Any, **kwargs: Any) -> None:
        marks.append(time.perf_counter())
        original(self, *args, **kwargs)

    engine.Trainer._log = timed_log
    start = time.perf_counter()
    code = entry.main(rest)
    if os.environ.get("RANK", "0") == "0":
        record = {"exit_code": code, "start_s": 0.0, "marks_s": [m - start for m in marks]}
        probe.write_text(json.dumps(record | peaks(), indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
