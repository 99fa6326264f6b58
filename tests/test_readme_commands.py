"""Every `recipes list/show/check/plan` and `recipes run ... --dryrun` line of the README runs as
written and exits 0: an example that fails as printed is a bug of the README or of the product.

The lines are read from the README's bash blocks (backslash continuations joined, comments cut)
and run in-process through `recipes.cli.main`, from the repository's root.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from recipes.cli import main

REPO = Path(__file__).resolve().parents[1]
FAST = ("list", "show", "check", "plan")


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split("  #", 1)[0].strip()
            if not line.startswith((".venv/bin/recipes ", "recipes ")):
                continue
            words = shlex.split(line)
            if len(words) > 1 and (words[1] in FAST or (words[1] == "run" and "--dryrun" in words)):
                out.append(line)
    return out


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
