"""`recipes data tokenize` against Megatron-LM's tools/preprocess_data.py, side by side in one run.

    .venv/bin/python bench/tokenize_vs_megatron.py --megatron-lm /path/to/Megatron-LM \
        [--mb 35] [--workers 1 2] [--repeat 1]

The same corpus (a JSONL of ~`--mb` MB made here from the text of the Python files under this
venv's site-packages: English docstrings and code, documents of 1-8 KB), the same HF tokenizer
folder (a byte-level BPE of 32,000 ids trained here on that corpus, saved by transformers), the
same worker count, EOD appended. Megatron-LM's tool runs from the given checkout (bring it with
`git clone`; nothing of it is in this repository), with this venv's Python. For each tool and
worker count: wall seconds, CPU seconds (the process and every process it waited for), documents/s
and tokens per CPU-second; then whether the two .bin/.idx pairs are byte-identical.
tools/preprocess_data_fast.py is tried too and reported as it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make_corpus(path: Path, megabytes: float, seed: int = 0) -> int:
    """Documents cut from the site-packages' .py files, in a shuffled but fixed order."""
    files = sorted(Path(sys.prefix).glob("lib/python3*/site-packages/**/*.py"))
    random.Random(seed).shuffle(files)
    rng, written, docs = random.Random(seed), 0, 0
    with path.open("w", encoding="utf-8") as out:
        for f in files:
            try:
                text = f.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            while text and written < megabytes * 1e6:
                size = rng.randint(1000, 8000)
                line = json.dumps({"text": text[:size]}) + "\n"
                text = text[size:]
                out.write(line)
                written += len(line)
                docs += 1
            if written >= megabytes * 1e6:
                break
    return docs


def make_tokenizer(corpus: Path, folder: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    from data.tools.make_tokenizer import train_bpe_tokenizer

    texts = [json.loads(line)["text"] for _, line in zip(range(3000), corpus.open(), strict=False)]
    path = train_bpe_tokenizer(texts=texts, vocab_size=32000, out=folder.parent / "bpe.json")
    tok = PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token="<|endoftext|>")
    tok.save_pretrained(folder)


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, str]:
    """(wall s, CPU s of the command and every process it waited for, its output's tail)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv[:3])} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
        )
    return wall, cpu, (done.stdout + done.stderr)[-300:]


def count(prefix: str) -> tuple[int, int]:
    from data.indexed import check_index

    facts = check_index(prefix)
    return facts.documents, facts.tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--megatron-lm", required=True, type=Path, help="a Megatron-LM checkout")
    parser.add_argument("--mb", type=float, default=35.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="work folder to keep (default: a temporary one)")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="tokenize-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus, tokenizer = work / "corpus.jsonl", work / "tokenizer"
    if not corpus.exists():
        print(f"corpus: {make_corpus(corpus, args.mb)} documents", file=sys.stderr)
    if not tokenizer.exists():
        make_tokenizer(corpus, tokenizer)
    mb = corpus.stat().st_size / 1e6
    env = os.environ | {"TOKENIZERS_PARALLELISM": "true"}
    mlm_env = env | {"PYTHONPATH": str(args.megatron_lm)}
    rows = []
    for workers in args.workers:
        for rep in range(args.repeat):
            theirs = work / f"mlm-{workers}"
            wall, cpu, _ = timed(
                [sys.executable, str(args.megatron_lm / "tools" / "preprocess_data.py"),
                 "--input", str(corpus), "--output-prefix", str(theirs),
                 "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tokenizer),
                 "--workers", str(workers), "--append-eod", "--log-interval", "1000000"],
                mlm_env, work,
            )  # fmt: skip
            docs, tokens = count(f"{theirs}_text_document")
            rows.append(("preprocess_data.py", workers, rep, wall, cpu, docs, tokens))
            ours = work / f"ours-{workers}"
            subprocess.run(["rm", "-rf", str(ours)], check=True)
            wall, cpu, _ = timed(
                [sys.executable, "-m", "recipes", "data", "tokenize", str(corpus), str(ours),
                 "--tokenizer", str(tokenizer), "--workers", str(workers), "--quiet"],
                env, REPO,
            )  # fmt: skip
            (prefix,) = [p.with_suffix("") for p in (ours / "shards").glob("*.bin")]
            docs, tokens = count(str(prefix))
            rows.append(("recipes data tokenize", workers, rep, wall, cpu, docs, tokens))
            same = all(
                Path(f"{theirs}_text_document{ext}").read_bytes()
                == Path(f"{prefix}{ext}").read_bytes()
                for ext in (".bin", ".idx")
            )
            print(f"workers {workers}, run {rep}: .bin/.idx byte-identical: {same}")
    fast = work / "fast"
    try:
        wall, cpu, _ = timed(
            [sys.executable, str(args.megatron_lm / "tools" / "preprocess_data_fast.py"),
             "--input", str(corpus), "--output-prefix", str(fast),
             "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tokenizer),
             "--append-eod"],
            mlm_env, work,
        )  # fmt: skip
        docs, tokens = count(f"{fast}_text_document")
        rows.append(("preprocess_data_fast.py", 0, 0, wall, cpu, docs, tokens))
    except RuntimeError as err:
        print(f"preprocess_data_fast.py does not run here: {str(err).splitlines()[-1]}")
    print(f"\ncorpus {mb:.1f} MB, {rows[0][5]} documents, {rows[0][6]:,} tokens; 32,000-id BPE")
    print("| tool | workers | wall s | CPU s | documents/s | tokens per CPU-second |")
    print("|---|---|---|---|---|---|")
    for tool, workers, _, wall, cpu, docs, tokens in rows:
        print(
            f"| {tool} | {workers or '-'} | {wall:.1f} | {cpu:.1f} | {docs / wall:,.0f} "
            f"| {tokens / cpu:,.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
