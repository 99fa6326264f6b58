"""Predicted (config/cost/memory.py, what `recipes check` prints) against measured peak GPU memory.

Each SHAPE is a catalog recipe cut to one GPU (TP = PP = CP = EP = 1, micro batch 1, one
microbatch per step) with a few layers, trained for three steps through the real entry point under
bench/gpu_rank.py, which reads torch.cuda.max_memory_allocated and max_memory_reserved at the end.
The ratio predicted / measured (allocated) is the figure; the goal is within 10% (0.9 to 1.1).

    python bench/gpu_memory.py --out DIR [--shapes dense,moe_ep1] [--cpu-dry-run]

With --cpu-dry-run every shape is shrunk (recipes/shrink.py) and run on the CPU: the plumbing is
exercised and the process's peak RSS recorded, but there is no GPU memory to compare.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from config.cost.memory import estimate_memory  # noqa: E402
from config.finalize import complete, finalize  # noqa: E402
from config.hardware import Cluster  # noqa: E402
from config.rules import validate  # noqa: E402
from config.schema import TrainingConfig  # noqa: E402
from config.tree import apply_overrides, write_yaml  # noqa: E402
from recipes.advice.check import memory_parts  # noqa: E402
from recipes.registry import get  # noqa: E402

GOAL = 0.10  # predicted within 10% of measured
ONE_GPU = [
    "parallel.tensor_model_parallel_size=1",
    "parallel.pipeline_model_parallel_size=1",
    "parallel.virtual_pipeline_model_parallel_size=None",
    "parallel.pipeline_model_parallel_layout=None",
    "parallel.context_parallel_size=1",
    "parallel.sequence_parallel=false",
    "parallel.expert_model_parallel_size=1",
    "parallel.expert_tensor_parallel_size=None",
    "train.micro_batch_size=1",
    "train.global_batch_size=1",
    "train.max_steps=3",
    "train.eval_interval=0",
    "scheduler.warmup_steps=1",
    "scheduler.decay_steps=None",
    "checkpoint.save_interval=1000000",
    "checkpoint.pretrained_dir=None",
    "logging.tensorboard=false",
    "logging.progress_bar=false",
]
LAYER_8B = [  # Llama 3 8B's layer, for recipes whose own layer is tiny
    "model.hidden_size=4096",
    "model.ffn_hidden_size=14336",
    "model.num_attention_heads=32",
    "model.num_query_groups=8",
    "model.kv_channels=128",
]
RECOMPUTE = [
    "model.recompute_granularity=full",
    "model.recompute_method=uniform",
    "model.recompute_num_layers=1",
]


@dataclass(frozen=True)
class Shape:
    """A one-GPU cut of a recipe; `data` names a synthetic set the shape trains on (or none)."""

    name: str
    recipe: str
    overrides: tuple[str, ...]
    data: str | None = None  # "sft" or "vlm": made by `recipes data make-synthetic-*`


SHAPES = [
    Shape("dense", "llama3_8b_pretrain", ("model.num_layers=4",)),
    Shape("dense_recompute", "llama3_8b_pretrain", ("model.num_layers=4", *RECOMPUTE)),
    Shape("moe_ep1", "qwen3_30b_a3b_pretrain", ("model.num_layers=2", "model.seq_length=4096")),
    Shape(
        "sft_packed",
        "tiny_gpt_sft",
        ("model.num_layers=4", "model.seq_length=4096", *LAYER_8B),
        data="sft",
    ),
    Shape("llava", "llava_llama3_8b_pretrain", ("model.num_layers=4",), data="vlm"),
]


def data_overrides(kind: str | None, folder: Path) -> list[str]:
    if kind == "sft":
        return [f"data.path={folder / 'sft.jsonl'}", f"data.tokenizer={folder / 'tokenizer.json'}"]
    if kind == "vlm":
        return [f"data.path={folder}", f"data.tokenizer={folder / 'tokenizer.json'}"]
    return []


def make_data(kind: str, folder: Path, image_size: int) -> None:
    from recipes.cli import main as recipes_main

    if folder.exists():
        return
    args = ["data", f"make-synthetic-{kind}", str(folder), "--samples", "64"]
    if kind == "vlm":
        args += ["--image-size", str(image_size)]
    if recipes_main(args) != 0:
        raise RuntimeError(f"recipes {' '.join(args)} failed")


def config_for(shape: Shape, run_dir: Path, data_dir: Path, device: str) -> TrainingConfig:
    """The shape's config; on the CPU shrunk (recipes/shrink.py) after the one-GPU overrides."""
    base = get(shape.recipe).config()
    cfg = apply_overrides(base, [*ONE_GPU, *shape.overrides, f"logging.run_dir={run_dir}"])
    if device == "cpu":
        from recipes.shrink import shrink

        cfg = shrink(cfg)
        if cfg.model.num_moe_experts:  # alltoall needs a GPU; the CPU mode runs allgather
            cfg.model.moe_token_dispatcher_type = "allgather"
    extra = [f"train.device={device}", *data_overrides(shape.data, data_dir)]
    return apply_overrides(cfg, extra)


def predict(cfg: TrainingConfig, gpu: str) -> dict[str, Any]:
    """The estimate for one GPU of kind `gpu`, with the checker's verdict on the config."""
    cluster = Cluster(num_nodes=1, gpus_per_node=1, gpu=gpu)
    partial = finalize(cfg, cluster)
    problems = [f"{p.field}: {p.message}" for p in validate(cfg, cluster, partial)]
    derived = complete(partial)  # estimated whatever the verdict, when the values derive
    if derived is None:
        return {"problems": problems or ["no estimate"], "predicted_gib": None}
    memory = estimate_memory(cfg, cluster, derived)
    return {
        "problems": problems,
        "predicted_gib": memory.total_gib,
        "predicted_parts_gib": memory_parts(memory),
        "gpu_memory_gib": cluster.spec.memory_gib,
    }


def compare(predicted: float | None, measured: dict[str, float | None]) -> dict[str, Any]:
    """predicted / measured for the allocated and reserved peaks and the device's use at the end
    (CUDA context included); `within_goal` on allocated, the tensors the estimate counts."""
    out: dict[str, Any] = {"predicted_gib": predicted, **measured}
    for key in ("allocated", "reserved", "device_used"):
        value = measured.get(f"peak_{key}_gib", measured.get(f"{key}_gib"))
        ok = predicted is not None and value is not None and value > 0
        out[f"ratio_to_{key}"] = predicted / value if ok else None
    ratio = out["ratio_to_allocated"]
    out["within_goal"] = None if ratio is None else abs(ratio - 1.0) <= GOAL
    return out


Measure = Callable[[Path, Path, float], dict[str, Any]]


def measure_with_torchrun(
    config: Path, probe: Path, timeout: float, final_save: bool = False
) -> dict[str, Any]:
    """Train `config` on one process under bench/gpu_rank.py; its probe's figures."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    cmd += [str(REPO / "bench" / "gpu_rank.py"), "--probe", str(probe)]
    cmd += [*(["--no-final-save"] if not final_save else []), "--config", str(config)]
    log = probe.with_suffix(".log")
    with log.open("w") as f:
        proc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0 or not probe.exists():
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise RuntimeError(f"exit {proc.returncode}, log {log}:\n" + "\n".join(tail))
    return json.loads(probe.read_text())


def run_shapes(
    shapes: list[Shape],
    out: Path,
    *,
    device: str,
    gpu: str,
    measure: Measure = measure_with_torchrun,
    deadline: float | None = None,
) -> dict[str, Any]:
    """Predict and measure every shape; a shape that fails or finds no time says so and why."""
    results: dict[str, Any] = {}
    out.mkdir(parents=True, exist_ok=True)
    for shape in shapes:
        left = (deadline - time.monotonic()) if deadline is not None else 600.0
        if left < 30:
            results[shape.name] = {"skipped": "no time left in this run"}
            continue
        data_dir = out / f"data_{shape.data}_{device}"
        try:
            if shape.data:
                make_data(shape.data, data_dir, 336 if device == "cuda" else 32)
            cfg = config_for(shape, out / shape.name, data_dir, device)
            prediction = predict(cfg, gpu)
            if prediction["problems"]:
                results[shape.name] = {"skipped": "invalid", **prediction}
                continue
            too_big = prediction["predicted_gib"] > 0.9 * prediction["gpu_memory_gib"]
            if too_big and device == "cuda":
                results[shape.name] = {"skipped": "predicted not to fit", **prediction}
                continue
            config = write_yaml(cfg, out / f"{shape.name}.yaml")
            measured = measure(config, out / f"{shape.name}.probe.json", left - 10)
            figures = {k: v for k, v in measured.items() if k.endswith("_gib")}
            results[shape.name] = {
                "recipe": shape.recipe,
                "overrides": list(shape.overrides),
                **compare(prediction["predicted_gib"], figures),
                "predicted_parts_gib": prediction["predicted_parts_gib"],
            }
        except Exception as err:  # noqa: BLE001 - one shape's failure is a figure, not the end
            results[shape.name] = {"error": f"{type(err).__name__}: {err}"[-2000:]}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shapes", default=",".join(s.name for s in SHAPES))
    parser.add_argument("--cpu-dry-run", action="store_true")
    parser.add_argument("--gpu", default=None, help="GPU kind (default: the visible device's)")
    parser.add_argument("--budget-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    wanted = set(args.shapes.split(","))
    shapes = [s for s in SHAPES if s.name in wanted]
    device = "cpu" if args.cpu_dry_run else "cuda"
    gpu = args.gpu or ("h100" if args.cpu_dry_run else _visible_gpu())
    deadline = time.monotonic() + args.budget_s
    results = run_shapes(shapes, args.out, device=device, gpu=gpu, deadline=deadline)
    (args.out / "memory.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))
    return 0


def _visible_gpu() -> str:
    import torch

    from config.hardware import gpu_from_device_name

    kind = gpu_from_device_name(torch.cuda.get_device_name())
    if kind is None:
        sys.exit(f"unknown GPU {torch.cuda.get_device_name()!r}")
    return kind


if __name__ == "__main__":
    sys.exit(main())
