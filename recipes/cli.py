"""The `recipes` command: list, show, check, plan and run catalog recipes, list past runs; import
and export Hugging Face folders.

`list`, `show`, `check`, `plan` and `runs` import neither torch nor NeMo-Run, so they answer at once
on a login node; `run` imports the launchers only when it is called, `import` and `export` the converter.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from config.cost.memory import MEMORY_MARGIN
from config.hardware import GPUS, Cluster
from config.tree import ConfigError, to_dict, to_yaml
from data.tools.cli import add_data_parser, cmd_data
from launchers.jobsize import JobSize, job_cluster
from launchers.profile import EXECUTORS, Profile, load_profile, placeholders
from recipes.advice.check import EXIT_INVALID, EXIT_NO_FIT, check, render
from recipes.advice.plan import LAYOUT_FIELDS, pinned, plan
from recipes.advice.plan_text import render as render_plans
from recipes.recipe import Recipe
from recipes.registry import all_recipes, resolve

# What a profile gives `check` and `plan`: the cluster `recipes run --profile` would judge.
SIZES = (
    "cluster profile (a TOML file, or a name in launchers/profiles/): its GPU kind, GPUs per node, "
    "NVLink domain and nodes, as `recipes run --profile` takes them"
)


def _add_profile_arg(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--profile", "--cluster", dest="profile", metavar="NAME|FILE", help=text)


def _add_margin_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--memory-margin",
        type=float,
        default=MEMORY_MARGIN,
        help=f"share of GPU memory a config must leave free to fit (default {MEMORY_MARGIN})",
    )


def _margin(args: argparse.Namespace) -> float:
    """--memory-margin of `check` and `plan`, which judge fit alike."""
    if not 0 <= args.memory_margin < 1:
        raise ConfigError(
            [
                (
                    "--memory-margin",
                    f"is {args.memory_margin}; a share of memory in [0, 1), e.g. 0.08",
                )
            ]
        )
    return args.memory_margin


def _add_cluster_args(parser: argparse.ArgumentParser, profile_text: str) -> None:
    _add_profile_arg(parser, profile_text)
    parser.add_argument(
        "--nodes", type=int, help="number of nodes (default: the recipe's published run)"
    )
    parser.add_argument("--gpus-per-node", type=int, help="GPUs (processes) per node")
    # No argparse choices: launchers/profile.py job_cluster refuses an unknown kind with the
    # message every entry point gives (config/hardware.py gpu_kind_problem).
    parser.add_argument(
        "--gpu",
        metavar="KIND",
        help=f"GPU kind: {', '.join(GPUS)} or cpu (default: the recipe's)",
    )
    parser.add_argument(
        "--nvlink-domain",
        type=int,
        help="GPUs joined by NVLink (default: a node; 72 for GB200 NVL72)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recipes", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="list the catalog")
    p.add_argument("--json", action="store_true")

    for name, text in (
        ("show", "print a resolved recipe"),
        ("check", "validate and estimate memory"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("recipe")
        p.add_argument("overrides", nargs="*", help="dotlist overrides, e.g. train.max_steps=100")
        p.add_argument("--json", action="store_true")
        if name == "check":
            _add_margin_arg(p)
            _add_cluster_args(p, SIZES)

    p = sub.add_parser("plan", help="rank layouts (TP, PP, VPP, CP, EP) by predicted step time")
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*", help="dotlist overrides; layout fields given are pinned")
    p.add_argument("--json", action="store_true")
    p.add_argument("--top", type=int, default=5, help="how many layouts to print (default 5)")
    _add_margin_arg(p)
    _add_cluster_args(p, SIZES)

    p = sub.add_parser("run", help="check, then launch a recipe")
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*")
    _add_cluster_args(
        p,
        "cluster profile (a TOML file, or a name in launchers/profiles/): the executor, account, "
        "wall time, container or venv, and the job's default size",
    )
    p.add_argument(
        "--executor", choices=EXECUTORS, help="default: the profile's, else local (this machine)"
    )
    p.add_argument(
        "--device", choices=["cpu", "cuda"], help="cpu runs the CPU smoke mode over gloo"
    )
    p.add_argument("--shrink", action="store_true", help="tiny model, same topology and features")
    p.add_argument("--dryrun", action="store_true", help="print what would run, launch nothing")
    p.add_argument("--chain", type=int, default=1, help="Slurm: K jobs, each resuming the previous")
    p = sub.add_parser("profiles", help="list the cluster profiles shipped (--profile NAME)")
    p.add_argument("--show", metavar="NAME", help="print one profile's TOML, to copy and fill in")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("runs", help="list past runs: state, step, last loss, run directory")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--root", action="append", type=Path, help="a folder of run directories (default ./runs)"
    )
    _add_profile_arg(p, "cluster profile: list its run_root too")
    p = sub.add_parser(
        "import", help="Hugging Face folder -> Megatron dist checkpoint (a checkpoints folder)"
    )
    p.add_argument("hf_dir", help="a local Hugging Face model folder (config.json, safetensors)")
    p.add_argument("out_dir", help="a new folder: OUT_DIR/iter_0000000 and OUT_DIR/latest")
    p = sub.add_parser(
        "export", help="checkpoint -> Hugging Face folder (transformers, vLLM), or a LoRA adapter"
    )
    p.add_argument("checkpoint", help="a run's checkpoints folder (its latest) or one iter_XXXXXXX")
    p.add_argument("out_dir", help="a new folder for config.json, safetensors and tokenizer files")
    p.add_argument(
        "--family",
        help="Hugging Face architecture (e.g. LlamaForCausalLM); default: the one the run started "
        "from, else the first that fits the model",
    )
    p.add_argument(
        "--max-shard-gb", type=float, default=5.0, help="largest safetensors file (default 5)"
    )
    p.add_argument(
        "--adapter",
        action="store_true",
        help="LoRA runs: write only the adapter, in Hugging Face PEFT's layout (default: merged)",
    )
    # `recipes data prepare|make-synthetic-vlm|make-synthetic-sft|make-synthetic-chat`
    add_data_parser(sub)
    return parser


def cmd_list(args: argparse.Namespace) -> int:
    recipes = all_recipes()
    if args.json:
        rows = [
            {
                "name": r.name,
                "nodes": r.cluster.num_nodes,
                "gpus_per_node": r.cluster.gpus_per_node,
                "gpu": r.cluster.gpu,
                "source": r.source,
                "summary": r.summary,
            }
            for r in recipes.values()
        ]
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(n) for n in recipes)
    for r in recipes.values():
        size = f"{r.cluster.world_size} x {r.cluster.gpu}"
        print(f"{r.name:<{width}}  {size:<12}  {r.summary}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    _, cfg = resolve(args.recipe, args.overrides)
    if args.json:
        print(json.dumps(to_dict(cfg), indent=2))
    else:
        print(to_yaml(cfg), end="")
    return 0


def job_size(args: argparse.Namespace) -> JobSize:
    """The size options of `check`, `plan` and `run` (only `run` has --device)."""
    return JobSize(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        gpu=args.gpu,
        nvlink_domain=args.nvlink_domain,
        device=getattr(args, "device", None),
    )


def sized(recipe: Recipe, args: argparse.Namespace) -> tuple[Cluster, Profile | None]:
    """The cluster `check` and `plan` judge, as `recipes run` with the same options would."""
    profile = load_profile(args.profile) if args.profile else None
    return job_cluster(recipe.cluster, profile, job_size(args)), profile


def cmd_check(args: argparse.Namespace) -> int:
    recipe, cfg = resolve(args.recipe, args.overrides)
    margin = _margin(args)
    cluster, profile = sized(recipe, args)
    report = check(cfg, cluster, pinned=pinned(cfg, args.overrides), margin=margin)
    unfilled = placeholders(profile) if profile else []
    if args.json:
        print(json.dumps(report.to_json() | {"profile_placeholders": unfilled}, indent=2))
    else:
        print(render(report))
        if unfilled:
            print(
                f"profile {args.profile}: {', '.join(unfilled)} still hold placeholders (<...>); "
                f"`recipes run` submits no job until they are filled in a copy "
                f"(recipes profiles --show {Path(args.profile).stem} > my.toml)"
            )
    return report.exit_code


def cmd_data_cache(args: argparse.Namespace) -> int:
    """`recipes data cache RECIPE [OVERRIDES]`: the run's index caches, built here."""
    _, cfg = resolve(args.recipe, args.overrides)
    from data.pretrain import prepare_index_caches

    try:
        folder = prepare_index_caches(cfg)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"index caches of {args.recipe} in {folder}: the ranks read them and build none")
    return 0


def cmd_data_array(args: argparse.Namespace) -> int:
    """`recipes data tokenize ... --profile P --tasks N`: the command as a Slurm array job."""
    from launchers.data_job import ArrayJob, render, write
    from launchers.sbatch import submit

    profile = load_profile(args.profile)
    tasks = args.tasks or 1
    if profile.executor == "local" or tasks < 1 or args.task is not None:
        raise ConfigError(
            [("--profile", f"{args.profile}: a Slurm profile and --tasks N (>= 1), no --task")]
        )
    options: list[tuple[str, ...]] = [
        ("--tokenizer", args.tokenizer),
        ("--on-error", args.on_error),
    ]
    options += [("--template", args.template)] if args.template else [("--text-key", args.text_key)]
    options += [("--no-eod",)] if args.no_eod else []
    out = os.path.abspath(args.out)
    name = f"tokenize-{os.path.basename(out.rstrip('/')) or 'data'}"
    job_dir = f"{profile.job_dir.rstrip('/')}/{name}" if profile.job_dir else f"{out}/slurm"
    job = ArrayJob(name, profile, tasks, job_dir, args.src, args.out, options)
    if args.dryrun:
        print(render(job), end="")
        return 0
    unfilled = placeholders(profile)
    if unfilled:
        raise ConfigError(
            [(key, "still holds a placeholder (<...>): fill it in a copy") for key in unfilled]
        )
    script = write(job)
    (array,) = submit(script)
    print(f"submitted array job {array}: {tasks} task(s), logs {job_dir}/{name}-{array}_<task>.out")
    print(
        f"the task that finishes last writes {out}/blend.json; the same command without "
        "--profile finishes whatever a failed task left"
    )
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """Exit 0 with the plans, 2 when the recipe is invalid whatever the layout, 3 when no layout
    fits."""
    recipe, cfg = resolve(args.recipe, args.overrides)
    cluster, profile = sized(recipe, args)
    if cluster.gpu == "cpu":
        raise ConfigError(
            [("--gpu", "is cpu; plan prices GPU layouts: name a GPU kind, e.g. --gpu h100")]
        )
    if args.top < 1:
        raise ConfigError([("--top", f"is {args.top}; ask for at least one plan, e.g. --top 5")])
    margin = _margin(args)
    pins = pinned(cfg, args.overrides)
    plans, searched = plan(cfg, cluster, top=args.top, pinned=pins, margin=margin)
    if not plans:  # a problem no layout can fix (precision, model, data, a field the command
        # line pinned) is the checker's to name
        report = check(cfg, cluster, suggest_fixes=False, margin=margin)
        report.problems = [
            p
            for p in report.problems
            if p.field in pins
            or (not p.field.startswith("parallel.") and p.field not in LAYOUT_FIELDS)
        ]
        if report.problems:
            print(json.dumps(report.to_json(), indent=2) if args.json else render(report))
            return EXIT_INVALID
    if args.json:
        print(json.dumps([p.to_json() for p in plans], indent=2))
    else:
        executor = profile.executor if profile else None
        user = args.overrides
        print(
            render_plans(
                cfg, cluster, plans, searched, args.recipe, user, args.profile, executor, margin
            )
        )
    return 0 if plans else EXIT_NO_FIT


def cmd_profiles(args: argparse.Namespace) -> int:
    """`recipes profiles`: a line per shipped profile (its size, GPU kind, network, executor and
    what it is); `--show NAME` its file as it is, to copy."""
    from launchers.profile import profile_path, shipped_profiles

    if args.show:
        path = profile_path(args.show)
        if not path.is_file():
            load_profile(args.show)  # the error that names the shipped ones
        print(path.read_text(encoding="utf-8"), end="")
        return 0
    rows: list[dict[str, Any]] = []
    for name, path in shipped_profiles().items():
        prof = load_profile(path)
        about = path.read_text(encoding="utf-8").splitlines()[0].lstrip("# ")
        cluster = job_cluster(None, prof, JobSize(nodes=prof.nodes or 1))
        rows.append(
            {
                "name": name,
                "executor": prof.executor,
                "gpus_per_node": prof.gpus_per_node,
                "gpu": prof.gpu,
                "network_gb_s": cluster.network if cluster.gpu != "cpu" else None,
                "placeholders": placeholders(prof),
                "about": about,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        net = f"{r['network_gb_s']:g} GB/s" if r["network_gb_s"] else "-"
        size = f"{r['gpus_per_node']} x {r['gpu']}"
        print(f"{r['name']:<{width}}  {size:<12}  {net:>9}  {r['executor']:<15}  {r['about']}")
    print("copy one to fill in its <...> values: recipes profiles --show NAME > my.toml")
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from recipes.runs import cmd_runs as list_runs

    roots = list(args.root or [])
    if args.profile:
        from launchers.profile import load_profile

        roots.append(Path(load_profile(args.profile).run_root or "runs").expanduser())
    return list_runs(roots or [Path("runs")], args.json)


def cmd_run(args: argparse.Namespace) -> int:
    from recipes.launch import run_command

    return run_command(
        args.recipe,
        args.overrides,
        job_size(args),
        executor=args.executor,
        profile=args.profile,
        shrink=args.shrink,
        dryrun=args.dryrun,
        chain=args.chain,
    )


def cmd_convert(args: argparse.Namespace) -> int:
    """`import` / `export`: exit 0 with the folder written, 2 with a named problem."""
    from pathlib import Path

    from training.hf.convert import ConvertError
    from training.hf.exporter import export_hf
    from training.hf.importer import import_hf
    from training.hf.lora_export import export_lora, holds_adapters

    try:
        if args.command == "import":
            out = import_hf(Path(args.hf_dir), Path(args.out_dir))
        elif args.adapter or holds_adapters(Path(args.checkpoint)):
            out = export_lora(
                Path(args.checkpoint),
                Path(args.out_dir),
                adapter=args.adapter,
                family_name=args.family,
            )
        else:
            limit = int(args.max_shard_gb * 2**30)
            out = export_hf(
                Path(args.checkpoint),
                Path(args.out_dir),
                family_name=args.family,
                max_shard_bytes=limit,
            )
    except (ConvertError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_INVALID
    print(f"wrote {out}")
    return 0


def _config_error(err: ConfigError, as_json: bool) -> int:
    if as_json:
        errors = [{"field": f, "message": m} for f, m in err.problems]
        print(json.dumps({"valid": False, "errors": errors}, indent=2))
    else:
        print(f"{len(err.problems)} problem(s):", file=sys.stderr)
        for field, message in err.problems:
            print(f"  {field}: {message}", file=sys.stderr)
    return EXIT_INVALID


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Overrides may come before or after options (`check R --gpu a100 precision=...`)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    stray = [
        a for a in extra if a.startswith("-") or "=" not in a or not hasattr(args, "overrides")
    ]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


# What the login-node install (requirements-login.txt) leaves out on purpose: a command that needs
# it (a local run, import, export) says so instead of a traceback.
TRAINING_STACK = ("torch", "megatron", "nemo_run")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    commands = {"list": cmd_list, "show": cmd_show, "check": cmd_check, "run": cmd_run}
    commands["plan"] = cmd_plan
    commands["runs"] = cmd_runs
    commands["profiles"] = cmd_profiles
    commands["data"] = cmd_data
    if args.command == "data" and args.data_command == "cache":
        commands["data"] = cmd_data_cache  # it resolves a recipe: this floor's work, not data's
    if args.command == "data" and args.data_command == "tokenize" and args.profile:
        commands["data"] = cmd_data_array  # a Slurm job: the launchers' floor
    commands["import"] = commands["export"] = cmd_convert
    try:
        return commands[args.command](args)
    except ConfigError as err:
        return _config_error(err, getattr(args, "json", False))
    except ModuleNotFoundError as err:
        top = (err.name or "").partition(".")[0]
        if top not in TRAINING_STACK or top in sys.modules:  # installed, but a part is missing
            raise
        slurm = ", or submit with a Slurm profile (--profile NAME, see recipes profiles)"
        print(
            f"error: recipes {args.command} needs {err.name}, which the login-node install "
            "(requirements-login.txt) leaves out: install the project with its dependencies "
            f"(pip install .){slurm if args.command == 'run' else ''}",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
