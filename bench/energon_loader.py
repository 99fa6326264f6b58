"""Energon loader throughput and packing efficiency on this machine (data.kind=energon).

    .venv/bin/python bench/energon_loader.py [--data DIR] [--batches 100] [--seq-length 256]

Builds the loader exactly as training does (data/energon.py `build_loader`: tiny_llava_pretrain's
config with data.path, num_workers, packing and model.seq_length overridden), for 0, 1 and 2
worker processes, without and with sequence packing, on the synthetic captioning set (generated
into a temporary folder unless --data is given). Per setting it reports:

- samples/s: source samples (image + caption) delivered per second in steady state, after two
  batches per worker (start-up: processes, shard index, shuffle and packing buffers) are skipped;
  the best of --repeat runs, since other processes on a shared machine only ever slow it down.
  The loop does nothing with a batch, so this is the loader alone: workers pay off when the
  training step keeps the main process busy, not here;
- CPU ms/sample: CPU time of the main process and its loader workers per sample over the same
  stretch, which other load on the machine hardly changes (wall time it does);
- fill (fixed): real LM positions / (rows x seq_length), what a fixed-shape batch pays (pipeline
  parallel pads every row to seq_length);
- fill (dynamic): real LM positions / (rows x longest row of its microbatch), what PP=1 pays, since
  LLaVAModel pads each microbatch only to its longest row.
A position is a text token or one of an image's embeddings (17 for the tiny ViT).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import psutil


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def measure(cfg, workers: int, batches: int) -> dict[str, float]:  # cfg: TrainingConfig
    from data.energon import build_loader

    loader = build_loader(cfg, 0, 1, num_workers=workers)
    loader.pin_memory = False
    iterator = iter(loader)
    for _ in range(2 * max(1, workers)):  # start-up: every worker's first batches, prefetch
        next(iterator)
    main = psutil.Process()
    procs = [main, *main.children(recursive=True)]  # the loader's worker processes
    cpu_before = sum(_cpu_seconds(p) for p in procs)
    samples = real = fixed = dynamic = 0
    started = time.perf_counter()
    for _ in range(batches):
        batch = next(iterator)
        samples += sum(len(key.split(",")) for key in batch.__key__)
        rows = batch.num_tokens
        real += int(rows.sum())
        fixed += len(rows) * cfg.model.seq_length
        dynamic += len(rows) * int(rows.max())
    elapsed = time.perf_counter() - started
    cpu = sum(_cpu_seconds(p) for p in procs) - cpu_before
    del iterator, loader
    return {
        "samples_per_s": samples / elapsed,
        "cpu_ms_per_sample": 1000 * cpu / samples,
        "samples_per_row": samples / (batches * cfg.train.micro_batch_size),
        "fill_fixed": real / fixed,
        "fill_dynamic": real / dynamic,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="a prepared Energon captioning set (default: generate one)")
    parser.add_argument("--tokenizer", help="default: DATA/tokenizer.json")
    parser.add_argument("--batches", type=int, default=100, help="timed microbatches per setting")
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--seq-length", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs per setting")
    args = parser.parse_args()

    from recipes.registry import get

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(args.data) if args.data else Path(tmp) / "synthetic_vlm"
        if not args.data:
            from data.tools.synthetic_vlm import make_synthetic_vlm

            make_synthetic_vlm(data, samples=1024, log=False)
        print(
            f"data {data if args.data else 'synthetic_vlm (1024 samples, 64 px)'}, micro batch "
            f"{args.micro_batch_size}, seq_length {args.seq_length}, {args.batches} microbatches, "
            f"best of {args.repeat}\n"
        )
        print(
            "| workers | packing | samples/s | CPU ms/sample | samples/row | fill (fixed) "
            "| fill (dynamic) |"
        )
        print("|---|---|---|---|---|---|---|")
        for packing in (False, True):
            for workers in (0, 1, 2):
                cfg = get("tiny_llava_pretrain").config()
                cfg.model.seq_length = args.seq_length
                cfg.train.micro_batch_size = args.micro_batch_size
                cfg.data.path = str(data)
                cfg.data.tokenizer = args.tokenizer or str(data / "tokenizer.json")
                cfg.data.sequence_packing = packing
                runs = [measure(cfg, workers, args.batches) for _ in range(args.repeat)]
                r = max(runs, key=lambda x: x["samples_per_s"])
                print(
                    f"| {workers} | {'on' if packing else 'off'} | {r['samples_per_s']:.0f} | "
                    f"{r['cpu_ms_per_sample']:.2f} | "
                    f"{r['samples_per_row']:.2f} | {r['fill_fixed']:.1%} | {r['fill_dynamic']:.1%} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
