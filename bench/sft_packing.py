"""Text SFT rows (data.kind=sft): packing efficiency and the cost of building and reading them.

    .venv/bin/python bench/sft_packing.py [--samples 5000] [--seq-lengths 512,2048,4096]

On two generated sets of prompt/response pairs, written to a temporary folder with the byte-level
BPE of `recipes data make-synthetic-sft`:
- "arithmetic": that command's own set (short questions and answers, about 20 tokens a pair);
- "long-tail": prompts and responses with log-normal word counts (median about 60 and 120 words,
  a few of several thousand), closer to instruction data such as Dolly or SQuAD with context.

Per set and model.seq_length, without and with data.sequence_packing, it reports:
- rows: the rows of one epoch (a row is one sample of the global batch);
- fill: real positions / (rows x seq_length), what padding every row to seq_length pays;
- loss share: positions whose label is a response token / (rows x seq_length);
- build s: reading, tokenizing, shuffling and packing (what each rank does once at start-up);
- rows/s: `dataset[i]` over the first 200 rows (the DataLoader's work per row, segment ids
  included when packed), best of 3.
Last, `pack` alone on a million log-normal lengths.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

WORDS = "what is plus minus times please answer briefly a question about numbers".split()


def long_tail_pairs(samples: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)

    def text(median_words: float) -> str:
        n = max(1, int(rng.lognormvariate(0, 1) * median_words))
        return " ".join(rng.choice(WORDS) + str(rng.randint(0, 99)) for _ in range(n))

    return [{"prompt": text(60), "response": text(120)} for _ in range(samples)]


def measure(path: Path, tokenizer, seq_length: int, packing: bool) -> dict[str, float]:
    from data.sft import SFTDataset

    started = time.perf_counter()
    ds = SFTDataset(
        str(path), tokenizer, seq_length=seq_length, num_samples=1, packing=packing, seed=0
    )
    build = time.perf_counter() - started
    real = sum(len(p.ids) - 1 for p in ds.pairs)
    answer = sum(len(p.ids) - max(p.prompt_len, 1) for p in ds.pairs)
    positions = len(ds.rows) * seq_length
    best = float("inf")
    n = min(200, len(ds))
    for _ in range(3):
        started = time.perf_counter()
        for i in range(n):
            ds[i]
        best = min(best, time.perf_counter() - started)
    return {
        "rows": len(ds.rows),
        "fill": real / positions,
        "loss": answer / positions,
        "build": build,
        "rows_per_s": n / best,
        "skipped": ds.skipped,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--seq-lengths", default="512,2048,4096")
    args = parser.parse_args()

    from data.tokenizer import load_tokenizer
    from data.tools.synthetic_sft import TOKENIZER, make_synthetic_sft

    with tempfile.TemporaryDirectory(prefix="bench-sft-") as tmp:
        arithmetic = make_synthetic_sft(Path(tmp), samples=args.samples)
        tokenizer = load_tokenizer(Path(tmp) / TOKENIZER)
        long_tail = Path(tmp) / "long_tail.jsonl"
        long_tail.write_text(
            "".join(json.dumps(p) + "\n" for p in long_tail_pairs(args.samples, seed=1)),
            encoding="utf-8",
        )
        print(f"{args.samples} pairs per set")
        print("| set | seq | packing | rows | fill | loss share | build s | rows/s | skipped |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, path in (("arithmetic", arithmetic), ("long-tail", long_tail)):
            for seq in (int(s) for s in args.seq_lengths.split(",")):
                for packing in (False, True):
                    r = measure(path, tokenizer, seq, packing)
                    print(
                        f"| {name} | {seq} | {'on' if packing else 'off'} | {r['rows']} | "
                        f"{r['fill']:.1%} | {r['loss']:.1%} | {r['build']:.2f} | "
                        f"{r['rows_per_s']:.0f} | {r['skipped']} |"
                    )
    print(pack_at_scale(1_000_000, 4096))


def pack_at_scale(n: int, capacity: int) -> str:
    """`pack` alone on n log-normal lengths (median ~150 tokens), as for a large SFT set."""
    from data.sft import pack

    rng = random.Random(0)
    lengths = [min(capacity, max(1, int(rng.lognormvariate(5, 1)))) for _ in range(n)]
    started = time.perf_counter()
    rows = pack(lengths, capacity)
    took = time.perf_counter() - started
    fill = sum(lengths) / (capacity * len(rows))
    return f"pack: {n:,} lengths into {len(rows):,} rows of {capacity} in {took:.2f} s, fill {fill:.1%}"


if __name__ == "__main__":
    main()
