"""Every command the README prints, and every command the program prints for the user to type,
runs as written and exits 0: an example that fails as printed is a bug of the text or of the
product.

- The README: each `recipes list/show/check/plan/runs` line of its code blocks, and each
  `recipes run` line that needs a cluster or a GPU (everything but the CPU runs, which the smoke
  tests run for real) with `--dryrun` added: nothing is launched, but the profile, the sizes, the
  checker and the sbatch script are all real. Lines are read from every code block (backslash
  continuations joined, comments cut), so the sample output of `recipes plan` counts too.
- The program: `recipes plan`'s "run the first with" command and its hint for containers,
  `recipes check`'s "predicted to fit with" changes, `recipes run`'s hint when a Slurm executor
  lacks a profile, and `recipes runs`' "stop" command of a live run.

Commands run in-process through `recipes.cli.main`, from the repository's root; the `nemo ...
--dryrun` lines (NeMo-Run's CLI) run as a subprocess of the venv's `nemo`.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from config.tree import write_yaml
from launchers.local import write_record
from recipes.cli import main
from recipes.registry import get
from tests.support import children
from training.checkpoint import dirs as checkpoint_dirs

REPO = Path(__file__).resolve().parents[3]
FAST = ("list", "show", "check", "plan", "runs", "profiles")
# `recipes run` lines whose inputs are the reader's own files (absolute paths on the machine that
# launches locally): the launcher refuses them here, as it should.
YOUR_FILES = (
    "recipes run llama3_8b_sft data.path=/data/",
    "recipes run llama3_8b_pretrain --profile my-",  # a site profile the reader filled in
    # The "Your own data" block: its files are made by its first lines, in its own folder
    # (tests/smoke/test_readme_own_data.py runs the block).
    "recipes check tiny_gpt_pretrain data.kind=indexed data.path=tokenized/",
)


def code_lines() -> list[str]:
    """Every line of the README's code blocks, continuations joined and comments cut."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```[\w-]*\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        out += [line.split("  #", 1)[0].strip() for line in joined.splitlines()]
    return out


def readme_commands() -> list[str]:
    """The `recipes` lines to run: the fast commands as written, `recipes run` with --dryrun."""
    out = []
    for line in code_lines():
        if not line.startswith((".venv/bin/recipes ", "recipes ")):
            continue
        line = line.split(" > ", 1)[0]  # what the shell writes into a file, the test reads
        words = shlex.split(line)
        if len(words) < 2 or line.removeprefix(".venv/bin/").startswith(YOUR_FILES):
            continue
        if words[1] in FAST or (words[1] == "run" and "--dryrun" in words):
            out.append(line)
        elif words[1] == "run" and "--device" not in words:  # a CPU run trains in the smoke tests
            out.append(f"{line} --dryrun")
    return out


NEMO_DRYRUNS = [line for line in code_lines() if line.startswith("nemo ") and "--dryrun" in line]


COMMANDS = readme_commands()


def run(line: str) -> tuple[int, str]:
    """A `recipes ...` command line as a user types it: exit code and what it printed."""
    words = shlex.split(line)
    assert words[0] in ("recipes", ".venv/bin/recipes"), line
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(words[1:])
        except SystemExit as exit:  # argparse: an unknown option
            code = exit.code
    return code, out.getvalue() + err.getvalue()


def test_the_readme_has_such_examples() -> None:
    assert len(COMMANDS) >= 20
    assert sum(" --profile " in line for line in COMMANDS) >= 5
    assert sum(line.split()[1] == "run" for line in COMMANDS) >= 8


@pytest.mark.parametrize("line", COMMANDS)
def test_readme_command_runs_as_written(line: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    code, out = run(line)
    assert code == 0, f"{line}\n{out[-3000:]}"


def test_the_readme_has_nemo_cli_examples() -> None:
    assert len(NEMO_DRYRUNS) >= 2


@pytest.mark.parametrize("line", NEMO_DRYRUNS)
def test_readme_nemo_dryrun_runs_as_written(line: str, tmp_path: Path) -> None:
    nemo = Path(sys.executable).parent / "nemo"
    env = os.environ | {"NEMORUN_HOME": str(tmp_path), "COLUMNS": "200"}
    out = children.run(
        [str(nemo), *shlex.split(line)[1:]],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert out.returncode == 0 and "dry run: checked" in out.stdout, out.stdout[-2000:] + out.stderr


# --- what the program prints for the user to type ------------------------------------------------


def printed_run_command(out: str) -> str:
    lines = out.splitlines()
    return lines[lines.index("run the first with:") + 1].strip()


@pytest.mark.parametrize(
    "plan",
    [
        "recipes plan llama3_8b_pretrain",  # one node: the local executor
        "recipes plan llama3_70b_pretrain --top 2",  # several: slurm-bare, and the container hint
        "recipes plan llama3_8b_pretrain --profile launchers/profiles/slurm-apptainer.toml --nodes 2",
        "recipes plan qwen3_30b_a3b_pretrain --profile slurm --nvlink-domain 4 --gpus-per-node 4 --nodes 4",
    ],
)
def test_plans_run_command_and_hint_run_as_printed(
    plan: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run the first with:` launches the plan it printed (dry run: the checker passes it on the
    cluster it was planned for); the hint's `--executor slurm --profile CLUSTER.toml` too."""
    monkeypatch.chdir(REPO)
    code, out = run(plan)
    assert code == 0, out
    command = printed_run_command(out)
    code, launched = run(f"{command} --dryrun")
    assert code == 0, f"{command}\n{launched[-3000:]}"
    assert "dry run: nothing" in launched
    hint = re.search(r"for a container use (.*?CLUSTER\.toml)", out)
    assert bool(hint) == ("--executor slurm-bare" in command), out
    if hint:
        profile = re.search(r"--executor (\S+)", hint.group(1)).group(1)
        words = hint.group(1).replace("CLUSTER.toml", f"launchers/profiles/{profile}.toml")
        container = command.replace("--executor slurm-bare", words)
        code, launched = run(f"{container} --dryrun")
        assert code == 0, f"{container}\n{launched[-3000:]}"
        assert "srun" in launched and "dry run: nothing submitted" in launched


@pytest.mark.parametrize(
    "check",
    [
        "recipes check llama3_8b_pretrain --gpu a100-40g --nodes 1 --gpus-per-node 4",
        "recipes check llama3_70b_pretrain parallel.tensor_model_parallel_size=1 "
        "parallel.pipeline_model_parallel_size=1 parallel.virtual_pipeline_model_parallel_size=None "
        "parallel.sequence_parallel=false --nodes 1",
    ],
)
def test_checks_fixes_fit_as_printed(check: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each "predicted to fit with" line, added to the same command (its `--nodes N` in place of
    the command's), passes `check`."""
    monkeypatch.chdir(REPO)
    code, out = run(check)
    lines = out.splitlines()
    fixes = lines[lines.index("predicted to fit with:") + 1 :]
    assert code == 3 and fixes, out
    for fix in fixes:
        words = fix.split("  (predicted", 1)[0].split()
        command = check
        if words[0] == "--nodes":
            command = re.sub(r"--nodes \d+", " ".join(words[:2]), command)
            words = words[2:]
        code, fitted = run(f"{command} {' '.join(words)}")
        assert code == 0, f"{fix}\n{fitted[-2000:]}"


def test_runs_hint_for_a_slurm_executor_without_a_profile_runs_as_printed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(REPO)
    line = "recipes run llama3_8b_pretrain --executor slurm --dryrun"
    code, out = run(line)
    hint = re.search(r"(--profile) FILE, see (launchers/profiles/\S+\.toml)", out)
    assert code == 2 and hint, out
    code, out = run(f"{line} {hint.group(1)} {hint.group(2)}")
    assert code == 0, out[-2000:]


def test_runs_stop_command_stops_the_run(tmp_path: Path) -> None:
    """`recipes runs` prints `stop (saves, then exits): kill -TERM PID on HOST` for a live local
    run: typed on that host, it stops the process."""
    run_dir = tmp_path / "live"
    cfg = get("tiny_gpt_pretrain").config()
    cfg.checkpoint.save_dir = str(run_dir / "checkpoints")
    write_yaml(cfg, run_dir / "config.yaml")
    lock = Path(cfg.checkpoint.save_dir) / checkpoint_dirs.LOCK_FILE
    lock.parent.mkdir(parents=True)
    lock.write_text("{}\n")
    live = children.start(  # stands in for the run: it holds the lock, as a live run does
        [
            sys.executable,
            "-c",
            "import fcntl, time\n"
            f"f = open({str(lock)!r}, 'a+'); fcntl.lockf(f, fcntl.LOCK_EX)\n"
            "print('held', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert live.stdout.readline().strip() == "held"
        host = socket.gethostname()
        write_record(run_dir, executor="local", pid=live.pid, host=host, state="RUNNING")
        code, out = run(f"recipes runs --root {tmp_path}")
        printed = re.search(r"stop \(saves, then exits\): (.*) on (\S+)$", out, re.M)
        assert code == 0 and printed and printed.group(2) == host, out
        children.run(printed.group(1), shell=True, check=True, timeout=30)
        assert live.wait(timeout=30) == -15  # SIGTERM
    finally:
        children.stop(live)
