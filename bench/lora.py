"""LoRA against full fine-tuning: trainable parameters, checkpoint size and predicted memory of
llama3_8b_lora (and qwen3_8b_lora) against their full-SFT twins, and the CPU step time of the tiny
LoRA recipe against its full-SFT twin.

    .venv/bin/python bench/lora.py              # the predictions (no torch, instant)
    .venv/bin/python bench/lora.py --cpu 20     # also 20 steps of tiny_llama_chat_lora, LoRA and full

Checkpoint bytes: what a run writes per save, model and optimizer. LoRA: the adapters in BF16 plus
Adam's FP32 master and two moments of them (2 + 12 bytes a parameter); full fine-tuning: every
weight, the same 2 + 12 bytes. The CPU part makes its chat data and tiny Hugging Face folder in a
temporary folder, runs each variant with `recipes run` (2 processes, TP 2) and reports the median
step time of the steps after the first two.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from config.cost.layers import lora_parameters  # noqa: E402
from config.cost.memory import count_parameters, estimate_memory  # noqa: E402
from config.rules import derive  # noqa: E402
from recipes.registry import resolve  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BYTES = 2 + 12  # BF16 weight + FP32 master, Adam's two moments


def predicted(recipe: str, overrides: list[str]) -> dict[str, float]:
    spec, cfg = resolve(recipe, overrides)
    cluster = spec.cluster
    count = count_parameters(cfg)
    if cfg.peft.scheme == "lora":
        m = cfg.model
        dense = count.num_dense_layers if m.num_moe_experts else m.num_layers
        trainable = dense * lora_parameters(cfg, False) + count.num_moe_layers * lora_parameters(
            cfg, True
        )
    else:
        trainable = count.total
    memory = estimate_memory(cfg, cluster, derive(cfg, cluster))
    return {
        "gpus": cluster.world_size,
        "trainable": trainable,
        "share": trainable / count.total,
        "checkpoint_gib": trainable * BYTES / 2**30,
        "memory_gib": memory.total_gib,
    }


def cpu_step_times(steps: int) -> dict[str, float]:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        run = [sys.executable, "-m", "recipes"]
        subprocess.run(
            [
                *run,
                "data",
                "make-synthetic-chat",
                str(root / "chat.jsonl"),
                "--tokenizer",
                str(root / "tok"),
            ],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                sys.executable,
                str(REPO / "scripts/make_tiny_hf.py"),
                str(root / "hf"),
                "--tokenizer",
                str(root / "tok"),
            ],
            check=True,
            capture_output=True,
        )
        for name, scheme in (("lora", "lora"), ("full", "none")):
            run_dir = root / name
            args = [
                "run",
                "tiny_llama_chat_lora",
                "--device",
                "cpu",
                f"peft.scheme={scheme}",
                f"train.max_steps={steps}",
                "scheduler.warmup_steps=1",
                "checkpoint.save_interval=100000",
                f"data.path={root / 'chat.jsonl'}",
                f"data.tokenizer={root / 'tok'}",
                f"checkpoint.pretrained_dir={root / 'hf'}",
                f"logging.run_dir={run_dir}",
            ]
            subprocess.run([*run, *args], check=True, capture_output=True, cwd=REPO)
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
            out[name] = statistics.median(r["step_time_s"] for r in rows[2:])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", type=int, default=0, metavar="STEPS")
    args = parser.parse_args()
    rows = [
        ("llama3_8b_lora", []),
        ("llama3_8b_lora (full SFT)", ["peft.scheme=none"]),
        ("qwen3_8b_lora", []),
        ("qwen3_8b_lora (full SFT)", ["peft.scheme=none"]),
    ]
    print(
        f"{'recipe':<28} {'GPUs':>4} {'trainable':>14} {'share':>7} {'ckpt GiB':>9} {'GiB/GPU':>8}"
    )
    for label, overrides in rows:
        p = predicted(label.split()[0], overrides)
        print(
            f"{label:<28} {p['gpus']:>4} {p['trainable']:>14,.0f} {p['share']:>7.2%} "
            f"{p['checkpoint_gib']:>9.2f} {p['memory_gib']:>8.1f}"
        )
    if args.cpu:
        times = cpu_step_times(args.cpu)
        print(
            f"tiny_llama_chat_lora on the CPU (TP 2, 2 processes), median step: LoRA "
            f"{times['lora']:.3f} s, full {times['full']:.3f} s ({times['lora'] / times['full']:.2f}x)"
        )


if __name__ == "__main__":
    main()
