"""Every `recipes list/show/check/plan/runs` and `recipes run ... --dryrun` line of the README runs
as written and exits 0: an example that fails as printed is a bug of the README or of the product.

The lines are read from the README's bash blocks (backslash continuations joined, comments cut)
and run in-process through `recipes.cli.main`, from the repository's root; the `nemo ... --dryrun`
lines (NeMo-Run's CLI) run as a subprocess of the venv's `nemo`.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from recipes.cli import main
from tests.support import children

REPO = Path(__file__).resolve().parents[3]
FAST = ("list", "show", "check", "plan", "runs")


def readme_lines() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        out += [line.split("  #", 1)[0].strip() for line in joined.splitlines()]
    return out


def readme_commands() -> list[str]:
    out = []
    for line in readme_lines():
        if not line.startswith((".venv/bin/recipes ", "recipes ")):
            continue
        words = shlex.split(line)
        if len(words) > 1 and (words[1] in FAST or (words[1] == "run" and "--dryrun" in words)):
            out.append(line)
    return out


NEMO_DRYRUNS = [line for line in readme_lines() if line.startswith("nemo ") and "--dryrun" in line]


COMMANDS = readme_commands()


def test_the_readme_has_such_examples() -> None:
    assert len(COMMANDS) >= 8


@pytest.mark.parametrize("line", COMMANDS)
def test_readme_command_runs_as_written(
    line: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(REPO)
    code = main(shlex.split(line)[1:])
    out = capsys.readouterr()
    assert code == 0, f"{line}\n{out.out[-2000:]}\n{out.err[-2000:]}"


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
