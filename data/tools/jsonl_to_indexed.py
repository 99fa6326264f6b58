"""Convert JSONL text into a Megatron indexed dataset (.bin/.idx) for data.kind=indexed.

    python -m data.tools.jsonl_to_indexed --input x.jsonl --tokenizer tok.json \\
        --output-prefix out/prefix [--text-key text] [--append-eod] [--workers N]

The prefix (out/prefix, without .bin/.idx) is what goes into data.path.
"""

from __future__ import annotations

import argparse
import sys

from data.indexed import JsonlError, jsonl_to_indexed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m data.tools.jsonl_to_indexed", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--input", required=True, help="a .jsonl (or .jsonl.gz) file")
    parser.add_argument("--tokenizer", required=True, help="tokenizer.json or HF tokenizer folder")
    parser.add_argument("--output-prefix", required=True, help="writes PREFIX.bin and PREFIX.idx")
    parser.add_argument("--text-key", default="text", help="JSON key holding the document text")
    # Without an end-of-document token, concatenated documents run into each other in a sample.
    parser.add_argument("--append-eod", action="store_true", help="end each document with EOD")
    parser.add_argument("--workers", type=int, default=1, help="tokenizer processes")
    args = parser.parse_args(argv)
    try:
        stats = jsonl_to_indexed(
            args.input,
            args.tokenizer,
            args.output_prefix,
            text_key=args.text_key,
            append_eod=args.append_eod,
            workers=args.workers,
        )
    except (JsonlError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(
        f"wrote {stats.bin_path} and {stats.idx_path}: {stats.documents} documents, "
        f"{stats.tokens} tokens ({stats.skipped_empty} empty lines skipped); "
        f"use data.kind=indexed data.path={args.output_prefix}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
