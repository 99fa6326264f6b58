"""The login-node install (requirements-login.txt, then `pip install --no-deps .`) runs every
login-path command; the oracle is Python itself.

Each command runs in a fresh interpreter whose import system refuses torch, Megatron-Core, NeMo-Run
and the rest of the training stack (a meta-path finder, as on a login node without them) and
records every import the command tries. The test then maps each module the command imported to the
distribution that installed it (importlib.metadata.packages_distributions) and fails on any that
requirements-login.txt, with what its lines pull in, does not cover: a new import on the login path
fails here before it fails on a login node. No network: the commands run in this venv.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from config.tree import write_yaml
from launchers.local import write_record
from recipes.registry import all_recipes, get
from tests.support import children

REPO = Path(__file__).resolve().parents[3]
LOGIN = REPO / "requirements-login.txt"
# What the login install leaves out (import names): the training stack, run on the compute nodes.
BLOCKED = ("torch", "megatron", "nemo_run", "fiddle", "transformers", "transformer_engine")

# Runs argv lists through recipes.cli.main in one interpreter, with BLOCKED refused; writes the exit
# codes (or the traceback), the imports it refused, and every module imported after start-up.
HARNESS = """
import importlib.abc, json, sys, traceback
blocked, out, argvs = set(sys.argv[1].split(',')), sys.argv[2], json.loads(sys.argv[3])
at_start, refused, codes = set(sys.modules), [], []

class NotOnALoginNode(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition('.')[0] in blocked:
            refused.append(name)
            raise ModuleNotFoundError(f'No module named {name!r}', name=name)
        return None

sys.meta_path.insert(0, NotOnALoginNode())
from recipes.cli import main
for argv in argvs:
    try:
        codes.append(main(argv))
    except SystemExit as exit:
        codes.append(exit.code)
    except Exception:
        codes.append(traceback.format_exc())
modules = {n: getattr(m, '__file__', None) for n, m in list(sys.modules.items()) if n not in at_start}
with open(out, 'w') as f:
    json.dump({'codes': codes, 'refused': refused, 'modules': modules}, f)
"""


def run_login(argvs: list[list[str]], tmp_path: Path) -> tuple[list[object], list[str], dict, str]:
    """Run `recipes ARGV` for each argv in one fresh interpreter, from tmp_path (the run
    directories a dry run names land there): exit codes, refused imports, imported modules and
    what the commands printed."""
    out = tmp_path / "imports.json"
    args = [sys.executable, "-c", HARNESS, ",".join(BLOCKED), str(out), json.dumps(argvs)]
    done = children.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.is_file(), done.stdout[-2000:] + done.stderr[-3000:]
    found = json.loads(out.read_text())
    return found["codes"], found["refused"], found["modules"], done.stdout


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def login_requirements() -> list[Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in LOGIN.read_text().splitlines())
    return [Requirement(line) for line in lines if line]


def covered() -> set[str]:
    """The distributions `pip install -r requirements-login.txt` installs: its lines and what they
    require, recursively (extras left out), as installed here."""
    todo, seen = [canonical(r.name) for r in login_requirements()], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for line in md.requires(name) or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonical(req.name))
    return seen


def outside_login(modules: dict[str, str | None]) -> list[str]:
    """Each imported module that is neither the standard library, the project's own, nor installed
    by a distribution that the login install covers: `module (distribution)`."""
    owners, ok, problems = md.packages_distributions(), covered(), []
    for name, file in sorted(modules.items()):
        top = name.partition(".")[0]
        if top in sys.stdlib_module_names or (file and Path(file).is_relative_to(REPO / top)):
            continue
        if file is None and top not in owners:  # made at run time: Cython's cython_runtime
            continue
        dists = {canonical(d) for d in owners.get(top, [])}
        if not dists & (ok | {"megatron-recipes"}):
            problems.append(f"{name} ({', '.join(sorted(dists)) or 'no distribution'})")
    return problems


@pytest.fixture
def past_run(tmp_path: Path) -> Path:
    """A run directory as a Slurm job leaves it: config.yaml, metrics.jsonl, the launch record."""
    run_dir = tmp_path / "runs" / "tiny-1"
    cfg = get("tiny_gpt_pretrain").config()
    cfg.checkpoint.save_dir = str(run_dir / "checkpoints")
    write_yaml(cfg, run_dir / "config.yaml")
    steps = (json.dumps({"step": s, "loss": 4.0 - s}) for s in (1, 2))
    (run_dir / "metrics.jsonl").write_text("\n".join(steps) + "\n")
    write_record(run_dir, executor="slurm", job_ids=["42"], state="SUBMITTED")
    return run_dir


LOGIN_COMMANDS = {
    "list": (["list", "--json"], 0),
    "show": (["show", "llama3_8b_pretrain", "train.max_steps=100"], 0),
    "check": (["check", "llama31_405b_pretrain"], 0),
    "check --profile": (["check", "llama3_8b_pretrain", "--profile", "jupiter"], 0),
    "check, no fit: fixes": (["check", "llama3_8b_pretrain", "--gpu", "a100-40g", "--json"], 3),
    "plan": (["plan", "llama3_70b_pretrain", "--profile", "jupiter", "--nodes", "16"], 0),
    "runs": (["runs", "--json"], 0),
    "profiles": (["profiles"], 0),
    "profiles --show": (["profiles", "--show", "jupiter"], 0),
    "run apptainer": (["run", "llama3_8b_pretrain", "--profile", "jupiter", "--dryrun"], 0),
    "run pyxis, chain": (
        ["run", "llama3_8b_pretrain", "--profile", "slurm", "--chain", "2", "--dryrun"],
        0,
    ),
    "run edf": (["run", "llama3_8b_pretrain", "--profile", "alps", "--nodes", "2", "--dryrun"], 0),
    "run bare": (["run", "llama3_8b_pretrain", "--profile", "slurm-bare", "--dryrun"], 0),
}


@pytest.mark.parametrize("name", LOGIN_COMMANDS)
def test_login_command_needs_only_the_login_install(
    name: str, tmp_path: Path, past_run: Path
) -> None:
    argv, code = LOGIN_COMMANDS[name]
    codes, refused, modules, printed = run_login([argv], tmp_path)
    assert codes == [code], f"{codes}\n{printed[-3000:]}"
    assert refused == [], f"recipes {' '.join(argv)} tried to import {refused}"
    assert outside_login(modules) == [], f"not in {LOGIN.name}: {outside_login(modules)}"
    if name == "runs":  # the past run was read: its config and its metrics
        assert str(past_run) in printed and '"last_loss": 2.0' in printed, printed


def test_every_recipes_slurm_dryrun_needs_only_the_login_install(tmp_path: Path) -> None:
    """The whole catalog rendered for JUPITER: 0, or the checker's 2 (e.g. a CPU recipe's) or 3
    (does not fit), never an import the login install lacks."""
    argvs = [["run", name, "--profile", "jupiter", "--dryrun"] for name in all_recipes()]
    codes, refused, modules, _ = run_login(argvs, tmp_path)
    crashed = {a[1]: c for a, c in zip(argvs, codes, strict=True) if c not in (0, 2, 3)}
    assert crashed == {} and refused == [], (crashed, refused)
    assert outside_login(modules) == []
    assert codes.count(0) >= len(argvs) // 2


def test_a_local_run_in_the_login_install_says_what_to_install(tmp_path: Path) -> None:
    """The local executor starts torchrun through NeMo-Run: with it missing, `recipes run` names
    the full install instead of a traceback."""
    codes, refused, _, _ = run_login([["run", "tiny_gpt_pretrain", "--dryrun"]], tmp_path)
    assert codes == [1] and refused and refused[0].startswith("nemo_run"), (codes, refused)


@pytest.mark.parametrize("missing", ["torch.not_there", "numpy"])
def test_a_missing_part_of_an_installed_stack_stays_an_error(
    missing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a training stack that is not installed at all is the login install's doing: a missing
    part of an installed torch, or another missing module, is a bug and keeps its traceback."""
    import torch  # noqa: F401

    from recipes import cli

    def broken(args: object) -> int:
        raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)

    monkeypatch.setattr(cli, "cmd_list", broken)
    with pytest.raises(ModuleNotFoundError):
        cli.main(["list"])


def test_the_oracle_names_what_the_list_lacks() -> None:
    """A module of a distribution outside the list is named, one that a listed line pulls in
    (Jinja2's MarkupSafe) is not; the project's own and the standard library's never are."""
    import markupsafe
    import psutil
    import yaml

    modules = {m.__name__: m.__file__ for m in (psutil, yaml, markupsafe, json)}
    modules["recipes.cli"] = str(REPO / "recipes" / "cli.py")
    assert outside_login(modules) == ["psutil (psutil)"]


def test_the_full_install_holds_the_login_install() -> None:
    """`pip install .` is a superset: every line of requirements-login.txt is a dependency in
    pyproject.toml too, with the same version bounds."""
    with (REPO / "pyproject.toml").open("rb") as f:
        full = {
            canonical(r.name): r
            for r in map(Requirement, tomllib.load(f)["project"]["dependencies"])
        }
    for req in login_requirements():
        assert canonical(req.name) in full, f"{req.name}: missing in pyproject.toml's dependencies"
        assert req.specifier == full[canonical(req.name)].specifier, req


def test_a_bare_slurm_run_without_a_profile_is_refused_from_a_login_install(
    tmp_path: Path,
) -> None:
    """--executor slurm-bare with no profile runs the ranks in the submitting venv: from a
    login-node install they would have no torch, so nothing is submitted."""
    argv = ["run", "tiny_gpt_pretrain", "--executor", "slurm-bare", "--nodes", "1"]
    argv += ["--gpus-per-node", "2", "--device", "cpu", "--dryrun"]
    codes, _, _, printed = run_login([argv], tmp_path)
    assert codes == [2], (codes, printed)
