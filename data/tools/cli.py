"""`recipes data ...`: tokenize corpora into indexed shards and blends (data.kind=indexed); prepare
Energon datasets for data.kind=energon; synthetic sets for demos.

    recipes data tokenize SRC... OUT --tokenizer DIR [--text-key K | --template T] [--workers N]
                          [--on-error stop|skip] [--no-eod] [--task I --tasks N]
                          [--profile P --tasks N [--dryrun]]   (a Slurm array: recipes/cli.py)
    recipes data blend CORPUS... --output FILE [--weights W1,W2,...]
    recipes data cache RECIPE [OVERRIDES...]      (recipes/cli.py: it resolves a recipe)
    recipes data prepare SRC OUT [--on-error skip|stop] [--shard-size N] [--split 1,0,0]
    recipes data make-synthetic-vlm [OUT] [--samples N] [--image-size S] [--seed K]
    recipes data make-synthetic-sft [OUT] [--samples N] [--seed K]
    recipes data make-synthetic-chat [OUT.jsonl] [--samples N] [--seed K] [--tokenizer DIR]

Only argparse at import time: `recipes list/show/check` build this parser too and must stay free
of torch; the work (PIL, Energon, torch) is imported when a data command runs.

Exit codes: 0 prepared (bad samples skipped are listed), 2 stopped or unusable input.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DEFAULT_SYNTHETIC = "runs/synthetic_vlm"  # tiny_llava_pretrain's data.path
DEFAULT_SYNTHETIC_SFT = "runs/synthetic_sft"  # tiny_gpt_sft's data.path is sft.jsonl in there
DEFAULT_SYNTHETIC_CHAT = "runs/synthetic_chat/chat.jsonl"


def add_data_parser(sub: argparse._SubParsersAction) -> None:
    """The `data` subcommand and its own subcommands, on the `recipes` parser."""
    data = sub.add_parser(
        "data",
        help="prepare Energon datasets (images + captions); make synthetic VLM / SFT / chat sets",
    )
    commands = data.add_subparsers(dest="data_command", required=True)

    p = commands.add_parser(
        "tokenize",
        help="JSONL (.gz, .zst), Parquet, Arrow files or folders -> indexed shards + blend.json",
    )
    p.add_argument("src", nargs="+", help="files, folders (searched) or globs; each file a shard")
    p.add_argument("out", help="the output folder: shards/, manifest.json, blend.json")
    p.add_argument("--tokenizer", required=True, help="tokenizer.json or HF tokenizer folder")
    text = p.add_mutually_exclusive_group()
    text.add_argument("--text-key", default="text", help="the field holding a document's text")
    text.add_argument("--template", help='a document made of several fields: "{title}\\n\\n{text}"')
    p.add_argument(
        "--no-eod", action="store_true", help="do not end each document with the EOD token"
    )
    p.add_argument(
        "--workers", type=int, default=len(os.sched_getaffinity(0)), help="default: every core"
    )
    p.add_argument(
        "--on-error",
        choices=["stop", "skip"],
        default="stop",
        help="a bad record (not UTF-8, broken JSON, a missing field): stop there, or skip and "
        "count it (default: stop)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    # A Slurm array: task I of N takes every N-th shard; the last to finish writes the blend.
    p.add_argument("--task", type=int, default=None, help="this array task (SLURM_ARRAY_TASK_ID)")
    p.add_argument("--tasks", type=int, default=None, help="array tasks in all")
    p.add_argument(
        "--profile",
        help="submit as a Slurm array of --tasks tasks with this site profile (NAME or FILE); "
        "paths as the job sees them",
    )
    p.add_argument("--dryrun", action="store_true", help="with --profile: print the script only")

    p = commands.add_parser(
        "cache",
        help="build a run's Megatron index caches here, once, before the job (prepare_cache.py)",
    )
    p.add_argument("recipe", help="the recipe whose indexed data.path to prepare")
    p.add_argument("overrides", nargs="*", help="dotlist overrides, as for recipes run")

    p = commands.add_parser(
        "blend",
        help="one blend file over several tokenized corpora, weighted by tokens or as given",
    )
    p.add_argument("corpus", nargs="+", help="folders of `recipes data tokenize`, or blend files")
    p.add_argument("--output", "-o", required=True, help="the blend file to write (.json)")
    p.add_argument(
        "--weights", help="one weight per corpus, comma-separated (default: by their tokens)"
    )

    p = commands.add_parser(
        "prepare",
        help="images + same-name .txt captions (or a JSONL) -> WebDataset shards -> energon prepare",
    )
    p.add_argument("src", help="a folder of images with .txt captions, or a .jsonl of image/text")
    p.add_argument("out", help="the dataset folder to write (data.path)")
    p.add_argument(
        "--on-error",
        choices=["skip", "stop"],
        default="skip",
        help="a corrupt image or a missing caption: report and skip it, or stop (default: skip)",
    )
    p.add_argument("--shard-size", type=int, default=1000, help="samples per .tar shard")
    p.add_argument("--split", default="1,0,0", help="train,val,test ratio for energon prepare")

    p = commands.add_parser(
        "make-synthetic-vlm", help="a small generated captioning set (shapes), prepared"
    )
    p.add_argument("out", nargs="?", default=DEFAULT_SYNTHETIC, help=f"default {DEFAULT_SYNTHETIC}")
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)

    p = commands.add_parser(
        "make-synthetic-sft", help="a small generated prompt/response set (arithmetic) + tokenizer"
    )
    p.add_argument(
        "out", nargs="?", default=DEFAULT_SYNTHETIC_SFT, help=f"default {DEFAULT_SYNTHETIC_SFT}"
    )
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)

    p = commands.add_parser(
        "make-synthetic-chat",
        help="a small generated multi-turn chat set (arithmetic, system message) as JSONL",
    )
    p.add_argument(
        "out", nargs="?", default=DEFAULT_SYNTHETIC_CHAT, help=f"default {DEFAULT_SYNTHETIC_CHAT}"
    )
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="also write a tiny tokenizer folder with a ChatML chat template here",
    )


def cmd_data(args: argparse.Namespace) -> int:
    if args.data_command == "tokenize":
        from data.tools.tokenize_cli import cmd_tokenize

        return cmd_tokenize(args)
    if args.data_command == "blend":
        from data.tools.tokenize_cli import cmd_blend

        return cmd_blend(args)
    if args.data_command == "make-synthetic-sft":
        from data.tools.synthetic_sft import TOKENIZER, make_synthetic_sft

        try:
            path = make_synthetic_sft(args.out, samples=args.samples, seed=args.seed)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"wrote {args.samples} prompt/response pairs to {path}")
        print(f"use data.kind=sft data.path={path} data.tokenizer={path.parent / TOKENIZER}")
        return 0
    if args.data_command == "make-synthetic-chat":
        from data.tools.synthetic_chat import make_synthetic_chat

        try:
            path = make_synthetic_chat(
                args.out, samples=args.samples, seed=args.seed, tokenizer=args.tokenizer
            )
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"wrote {args.samples} conversations to {path}")
        tokenizer = args.tokenizer or "<the instruct model's tokenizer folder>"
        print(f"use data.kind=chat data.path={path} data.tokenizer={tokenizer}")
        return 0
    from data.tools.vlm_prepare import PrepareError

    try:
        if args.data_command == "prepare":
            from data.tools.vlm_prepare import prepare_captions

            report = prepare_captions(
                args.src,
                args.out,
                on_error=args.on_error,
                shard_size=args.shard_size,
                split=args.split,
            )
        else:
            from data.tools.synthetic_vlm import make_synthetic_vlm

            report = make_synthetic_vlm(
                args.out, samples=args.samples, image_size=args.image_size, seed=args.seed
            )
    except (PrepareError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(report.summary())
    hint = f"use data.kind=energon data.path={report.output}"
    if args.data_command == "make-synthetic-vlm":  # its own tokenizer sits in the folder
        from data.tools.synthetic_vlm import TOKENIZER

        hint += f" data.tokenizer={Path(report.output) / TOKENIZER}"
    else:
        hint += " data.tokenizer=<the language model's tokenizer.json or HF folder>"
    print(hint)
    return 0
