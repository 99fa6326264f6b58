"""The README's "Your own data" block, as written: a folder of mixed JSONL and Parquet files
tokenized into a blend, checked, its index caches built, and the tiny recipe trained on it on two
CPU ranks. The block is read from README.md and run by bash in a fresh folder, with `.venv/bin/`
and `scripts/` pointed at this checkout, so that the README cannot drift from what works."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.smoke.conftest import _env
from tests.support import children

pytestmark = pytest.mark.smoke
REPO = Path(__file__).resolve().parents[2]


def readme_block() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    match = re.search(r"### Your own data[^\n]*\n.*?```bash\n(.*?)```", text, re.S)
    assert match, "README.md lost its 'Your own data' block"
    return match.group(1)


def test_readme_own_data_path_runs_as_written(tmp_path: Path) -> None:
    venv_bin = str(Path(sys.executable).parent) + "/"
    script = readme_block().replace(".venv/bin/", venv_bin).replace("scripts/", f"{REPO}/scripts/")
    out = children.run(
        ["bash", "-e", "-c", script],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=900,
    )
    tail = (out.stdout + out.stderr)[-4000:]
    assert out.returncode == 0, tail
    manifest = json.loads((tmp_path / "tokenized" / "manifest.json").read_text())
    assert len(manifest["shards"]) == 3 and manifest["documents"] == 900, manifest
    assert "valid" in out.stdout and "index caches of tiny_gpt_pretrain" in out.stdout, tail
    run_dir = re.findall(r"^run directory: (.+)$", out.stdout, re.M)[-1]
    losses = [json.loads(line)["loss"] for line in Path(run_dir, "metrics.jsonl").open()]
    assert len(losses) == 40 and losses[-1] < losses[0] - 1.0, losses
