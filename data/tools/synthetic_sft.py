"""A small generated SFT set for tests and the CPU demo: arithmetic questions and their answers.

    recipes data make-synthetic-sft [OUT] [--samples N] [--seed K]

writes OUT/sft.jsonl (`{"prompt": "what is 12 plus 7 ?", "response": "12 plus 7 is 19 ."}`) and
OUT/tokenizer.json, a byte-level BPE trained on those lines (below tiny_gpt's 512 ids). The answer
follows from the prompt, so a tiny model's response loss falls within a few dozen steps. Prompts
come in three lengths, so that packing has rows of mixed samples to fill.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SFT_FILE = "sft.jsonl"
TOKENIZER = "tokenizer.json"
OPS = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b}
PREAMBLES = ("", "please answer briefly .", "a question about numbers , please answer it .")


def make_synthetic_sft(
    out: str | Path, *, samples: int = 2000, seed: int = 0, vocab_size: int = 384
) -> Path:
    """Write the pairs and their tokenizer under `out`; returns the JSONL's path (data.path)."""
    from data.tools.make_tokenizer import train_bpe_tokenizer

    if samples < 1:
        raise ValueError(f"--samples must be at least 1, got {samples}")
    rng = random.Random(seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pairs = []
    for _ in range(samples):
        a, b, op = rng.randint(0, 20), rng.randint(0, 20), rng.choice(list(OPS))
        question = f"what is {a} {op} {b} ?"
        prompt = f"{rng.choice(PREAMBLES)} {question}".strip()
        pairs.append({"prompt": prompt, "response": f"{a} {op} {b} is {OPS[op](a, b)} ."})
    path = out / SFT_FILE
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs), encoding="utf-8")
    texts = [f"{p['prompt']} {p['response']}" for p in pairs]
    train_bpe_tokenizer(vocab_size=vocab_size, out=out / TOKENIZER, texts=texts)
    return path
