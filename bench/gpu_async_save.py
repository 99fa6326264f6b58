"""The asynchronous checkpoint save on a real GPU: its step-time overhead, and that resume is exact.

Four runs of a one-GPU cut of llama32_1b_pretrain (bench/gpu_memory.py's ONE_GPU layout, 4 layers,
sequence 4096, about 0.5 B parameters: a checkpoint of some 7 GB, one at a time on disk), each under bench/gpu_rank.py, which takes the wall clock at every step's record
(the step plus what the checkpoint hook did after it):

- `plain`: 12 steps, no save;
- `async`: 12 steps, an asynchronous save every 4 (checkpoint.async_save=true, the GPU default);
- `first` then `resumed`: 8 steps saving at 4 and 8, then the same folder to 12 steps, which
  resumes from step 8.

overhead per save = (wall time of `async` - wall time of `plain`, steps 2..12) / saves in between;
resume is exact when the losses of steps 9..12 of `resumed` equal those of `async`.

    python bench/gpu_async_save.py --out DIR [--cpu-dry-run]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpu_memory import ONE_GPU, measure_with_torchrun  # noqa: E402

from config.tree import apply_overrides, write_yaml  # noqa: E402
from recipes.registry import get  # noqa: E402

STEPS, EVERY = 12, 4
SHAPE = ["model.num_layers=4", "model.seq_length=4096", f"scheduler.decay_steps={STEPS}"]


def write_config(out: Path, name: str, run_dir: Path, extra: list[str], device: str) -> Path:
    cfg = apply_overrides(get("llama32_1b_pretrain").config(), [*ONE_GPU, *SHAPE])
    if device == "cpu":
        from recipes.shrink import shrink

        cfg = shrink(cfg)
    overrides = [f"train.device={device}", f"logging.run_dir={run_dir}", *extra]
    overrides += ["checkpoint.keep_last=1", f"scheduler.decay_steps={STEPS}"]
    return write_yaml(apply_overrides(cfg, overrides), out / f"{name}.yaml")


def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r and "step" in r}


def overhead(plain: list[float], saving: list[float], saves: int) -> dict[str, float]:
    """Seconds per save: the extra wall time of the saving run over the same steps (from the
    first step's record on, so start-up and the first step's compilation are left out)."""
    plain_s, saving_s = plain[-1] - plain[0], saving[-1] - saving[0]
    steps = len(plain) - 1
    return {
        "plain_s_per_step": plain_s / steps,
        "saving_s_per_step": saving_s / steps,
        "overhead_s_per_save": (saving_s - plain_s) / saves,
        "overhead_share_of_step": (saving_s - plain_s) / saves / (plain_s / steps),
    }


def run(
    out: Path, device: str, measure: Callable[[Path, Path, float, bool], dict[str, Any]]
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    no_save = ["checkpoint.save_interval=1000000"]
    saving = [f"checkpoint.save_interval={EVERY}", "checkpoint.async_save=true"]
    plan = {
        "plain": (out / "plain", [f"train.max_steps={STEPS}", *no_save]),
        "async": (out / "async", [f"train.max_steps={STEPS}", *saving]),
        "first": (out / "resume", ["train.max_steps=8", *saving]),
        "resumed": (out / "resume", [f"train.max_steps={STEPS}", *saving]),
    }
    probes = {}
    for name, (run_dir, extra) in plan.items():
        config = write_config(out, name, run_dir, extra, device)
        # The end-of-run save stays on: `first` must leave step 8 behind for `resumed`.
        probes[name] = measure(config, out / f"{name}.probe.json", 300.0, True)
    # Saves strictly inside steps 1..12 of `async` (the one after step 12 ends the run).
    inside = len(range(EVERY, STEPS, EVERY))
    figures = overhead(probes["plain"]["marks_s"], probes["async"]["marks_s"], inside)
    straight, resumed = losses(out / "async"), losses(out / "resume")
    tail = range(9, STEPS + 1)
    for run_dir in {d for d, _ in plan.values()}:  # some 7 GB each on the GPU: free the disk
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    diffs = [abs(straight[s] - resumed[s]) for s in tail if s in straight and s in resumed]
    return {
        **figures,
        "saves_timed": inside,
        "resume_compared_steps": len(diffs),
        "resume_max_abs_loss_diff": max(diffs) if diffs else None,
        "resume_exact": bool(diffs) and len(diffs) == len(tail) and max(diffs) == 0.0,
        "peak_allocated_gib": probes["async"].get("peak_allocated_gib"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cpu-dry-run", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.out, "cpu" if args.cpu_dry_run else "cuda", measure_with_torchrun)
    (args.out / "async_save.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
