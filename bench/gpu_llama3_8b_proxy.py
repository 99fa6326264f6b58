"""One-GPU proxy of llama3_8b_pretrain: tokens/s, TFLOPS per GPU and MFU, BF16 and FP8.

The proxy keeps what sets a layer's speed (hidden 4096, FFN 14336, 32 heads in 8 query groups,
sequence 8192, vocabulary 128256, micro batch 1) and takes as many layers as the memory estimate
says fit on this GPU, so that one GPU runs the recipe's real kernels. MFU is measured against the
GPU's dense peak in the precision of the GEMMs (config/hardware.py), with the causal FLOPs formula
(config/cost/memory.py). Target: at least 50% MFU in BF16.

    # on a machine with one H100/H200 and this repository installed (torch + megatron-core, TE optional)
    python bench/gpu_llama3_8b_proxy.py [--layers N] [--steps 30] [--precision bf16_mixed ...]
        [--json FIGURES.json] [--cpu-dry-run]

--cpu-dry-run shrinks the model (recipes/shrink.py) and trains on the CPU: the plumbing only, no
MFU (bench/gpu_check.py's dry run).

Each precision runs as `torchrun --nproc-per-node 1 bench/gpu_rank.py ... --config ...`: the
entry point of a real job (training.entry.main) without its end-of-run checkpoint. The figures are
medians over the steps after the first five (warm-up, allocator growth, TE's FP8 calibration).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from config.cost.memory import estimate_memory, fits_memory  # noqa: E402
from config.hardware import Cluster, gpu_from_device_name  # noqa: E402
from config.rules import derive  # noqa: E402
from config.tree import apply_overrides, write_yaml  # noqa: E402
from recipes.registry import get  # noqa: E402

PRECISIONS = ["bf16_mixed", "bf16_with_fp8_current_scaling_mixed"]
# Steps of a run (--steps): past the 2 warmup steps, as the checker wants; memory and step time
# do not depend on them.
STEPS = 30


def proxy_overrides(layers: int, steps: int, precision: str, run_dir: Path) -> list[str]:
    return [
        f"model.num_layers={layers}",
        f"precision={precision}",
        "parallel.tensor_model_parallel_size=1",
        "parallel.context_parallel_size=1",
        "parallel.sequence_parallel=false",
        "train.micro_batch_size=1",
        "train.global_batch_size=4",  # 4 microbatches: gradient accumulation as in the recipe
        f"train.max_steps={steps}",
        "train.device=cuda",
        "scheduler.warmup_steps=2",
        "checkpoint.save_interval=1000000",
        "logging.tensorboard=false",
        "logging.progress_bar=false",
        f"logging.run_dir={run_dir}",
    ]


def layers_that_fit(gpu: str, precision: str) -> int:
    """The most layers the estimate says fit the GPU, as `recipes check` judges fit (keeping
    MEMORY_MARGIN free; at least 1). Up to the whole GPU, 26 layers on an H200 ran out of memory
    (2026-11-28: 129 GiB allocated of 139.8, 136.7 GiB predicted)."""
    cluster = Cluster(num_nodes=1, gpus_per_node=1, gpu=gpu)
    best = 1
    for layers in range(1, 33):
        cfg = apply_overrides(
            get("llama3_8b_pretrain").config(),
            proxy_overrides(layers, STEPS, precision, Path("/tmp")),
        )
        memory = estimate_memory(cfg, cluster, derive(cfg, cluster))
        if not fits_memory(memory, cluster.spec):
            break
        best = layers
    return best


def run(
    precision: str, layers: int, steps: int, workdir: Path, cpu: bool = False
) -> dict[str, float | None]:
    run_dir = workdir / precision
    cfg = apply_overrides(
        get("llama3_8b_pretrain").config(), proxy_overrides(layers, steps, precision, run_dir)
    )
    if cpu:
        from recipes.shrink import shrink

        cfg = apply_overrides(shrink(cfg), [f"train.max_steps={steps}", "train.device=cpu"])
    config = workdir / f"{precision}.yaml"
    write_yaml(cfg, config)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    # training.entry under a probe that skips the end-of-run checkpoint (tens of GB at 8B).
    probe = ["--probe", str(workdir / f"{precision}.probe.json"), "--no-final-save"]
    rank = [str(REPO / "bench" / "gpu_rank.py"), *probe, "--config", str(config)]
    subprocess.run([*cmd, *rank], cwd=REPO, check=True)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    measured = rows[5:] or rows

    def median(key: str) -> float | None:
        values = [r[key] for r in measured if r.get(key) is not None]
        return statistics.median(values) if values else None  # no MFU on the CPU

    keys = ("tokens_per_s", "tflops_per_gpu", "mfu", "step_time_s")
    return {key: median(key) for key in keys} | {"steps_measured": len(measured)}


def main() -> None:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, help="default: as many as the estimate says fit")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--precision", nargs="+", default=PRECISIONS)
    parser.add_argument("--json", type=Path, help="write {precision: figures} here")
    parser.add_argument("--cpu-dry-run", action="store_true")
    args = parser.parse_args()
    cpu = args.cpu_dry_run
    name = "cpu" if cpu else torch.cuda.get_device_name()
    gpu = "h100" if cpu else gpu_from_device_name(name)
    if gpu is None:
        sys.exit(f"unknown GPU {name!r}: MFU needs its peak in config/hardware.py")
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    figures: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for precision in args.precision:
            layers = args.layers or layers_that_fit(gpu, precision)
            result = run(precision, layers, args.steps, Path(tmp), cpu)
            figures[precision] = {"device": name, "layers": layers, "seq": 8192, **result}
            if args.json:  # after each precision: a later one that fails keeps the earlier
                args.json.write_text(json.dumps(figures, indent=1))
            if cpu:
                print(f"cpu dry run | {precision} | {result['tokens_per_s']:,.0f} tokens/s")
                continue
            print(
                f"{name} | {precision} | {layers} layers, seq 8192 | "
                f"{result['tokens_per_s']:,.0f} tokens/s | {result['tflops_per_gpu']:.0f} TFLOPS/GPU | "
                f"MFU {100 * result['mfu']:.1f}%"
            )


if __name__ == "__main__":
    main()
