"""The README's chat-LoRA path, as written: chat data and a tiny Hugging Face folder made on the
spot, LoRA on the CPU, the adapter and the merged model exported, peft's logits against the
merged model's.

The block is read from README.md (the code block after "End to end on this CPU") and run by bash in
a fresh folder, with `.venv/bin/` and `scripts/` pointed at this checkout, so that the README
cannot drift from what works.
"""

from __future__ import annotations

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
    match = re.search(r"End to end on this CPU[^\n]*\n\n```bash\n(.*?)```", text, re.S)
    assert match, "README.md lost its chat-LoRA block"
    return match.group(1)


def test_readme_chat_lora_path_runs_as_written(tmp_path: Path) -> None:
    pytest.importorskip("peft")
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
    assert (tmp_path / "runs/chat_lora_adapter/adapter_config.json").is_file()
    difference = float(re.findall(r"tensor\(([0-9.e-]+)", out.stdout)[-1])
    assert difference < 1e-4, tail
