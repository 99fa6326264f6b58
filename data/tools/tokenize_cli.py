"""The `recipes data tokenize` and `recipes data blend` commands (data/tools/cli.py parses them).

Exit codes: 0 done; 2 a bad input (named by file and line or row) or a bad argument.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

from data.tools.sources import SourceError


def _cpu_seconds() -> float:
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def cmd_tokenize(args: argparse.Namespace) -> int:
    from data.tools.tokenize import Settings, TokenizeError, finish, plan, run

    task = args.task if args.task is not None else int(os.environ.get("SLURM_ARRAY_TASK_ID", 0))
    tasks = (
        args.tasks if args.tasks is not None else int(os.environ.get("SLURM_ARRAY_TASK_COUNT", 1))
    )
    if args.workers < 1 or tasks < 1 or not 0 <= task < tasks:
        print(f"error: --workers {args.workers}, --task {task} of --tasks {tasks}", file=sys.stderr)
        return 2
    settings = Settings(
        tokenizer=args.tokenizer,
        text_key=args.text_key,
        template=args.template,
        append_eod=not args.no_eod,
        on_error=args.on_error,
    )
    start, cpu = time.monotonic(), _cpu_seconds()
    try:
        p = plan(args.src, args.out, settings)
        left = len(p.todo())
        print(f"{len(p.shards)} shard(s), {len(p.shards) - left} finished already", file=sys.stderr)
        done = run(p, args.workers, task=task, tasks=tasks, progress=not args.quiet)
        if tasks > 1 and p.todo():
            print(
                f"task {task} of {tasks}: {len(done)} shard(s) done; the blend is written by "
                "the task that finishes last, or by running the command once more"
            )
            return 0
        manifest = finish(p)
    except (SourceError, TokenizeError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    wall, cpu = time.monotonic() - start, _cpu_seconds() - cpu
    tokens = sum(manifest["shards"][i]["tokens"] for i in done)
    print(
        f"{args.out}: {len(p.shards)} shard(s), {manifest['documents']} documents, "
        f"{manifest['tokens']} tokens ({manifest['skipped_empty']} empty and "
        f"{manifest['skipped_bad']} bad records skipped); this run: {len(done)} shard(s), "
        f"{tokens} tokens in {wall:.1f} s ({tokens / max(cpu, 1e-9):,.0f} tokens per CPU-second)"
    )
    for record in manifest["shards"]:
        for bad in record["bad"]:
            print(f"  skipped: {bad}")
    print(
        f"use data.kind=indexed data.path={os.path.join(args.out, 'blend.json')} "
        f"data.tokenizer={args.tokenizer}"
    )
    return 0


def cmd_blend(args: argparse.Namespace) -> int:
    from data.tools.blend import make_blend

    try:
        weights = [float(w) for w in args.weights.split(",")] if args.weights else None
        blend = make_blend(args.corpus, args.output, weights)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}: {len(blend['sources'])} shard(s) from {len(args.corpus)} corpora")
    print(f"use data.kind=indexed data.path={args.output}")
    return 0
