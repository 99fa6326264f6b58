"""A small corpus of mixed files, standing in for your own, for the README's "Your own data":

    python scripts/sample_corpus.py corpus

writes corpus/web/part-0.jsonl, corpus/web/part-1.jsonl.gz and corpus/books/shelf.parquet:
documents of English words (a fixed seed), the text under "text" and a "title" beside it.
"""

from __future__ import annotations

import gzip
import json
import random
import sys
from pathlib import Path

WORDS = (
    "the a model trains on tokens while gradients flow through every layer of network and "
    "optimizer updates weights across nodes with pipeline tensor data parallel ranks each step "
    "reads batch from shared filesystem scratch project cluster job queue checkpoint resumes"
).split()


def documents(n: int, rng: random.Random) -> list[dict[str, str]]:
    return [
        {
            "title": f"doc {i}",
            "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 200))),
        }
        for i in range(n)
    ]


def main(out: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng, root = random.Random(0), Path(out)
    (root / "web").mkdir(parents=True, exist_ok=True)
    (root / "books").mkdir(parents=True, exist_ok=True)
    lines = ["".join(json.dumps(d) + "\n" for d in documents(300, rng)) for _ in range(2)]
    (root / "web" / "part-0.jsonl").write_text(lines[0])
    with gzip.open(root / "web" / "part-1.jsonl.gz", "wt") as f:
        f.write(lines[1])
    pq.write_table(pa.Table.from_pylist(documents(300, rng)), root / "books" / "shelf.parquet")
    print(f"wrote {root}/web/part-0.jsonl, {root}/web/part-1.jsonl.gz, {root}/books/shelf.parquet")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "corpus")
