"""training/cpu_mode.py `import_megatron_core`: a CPU rank imports Megatron-Core without
TorchDynamo's compiler (its fused kernels stay plain functions), and torch.compile is torch's own
again afterwards. In a fresh interpreter: pytest's process may hold Megatron-Core already."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support import children

pytest.importorskip("megatron.core")

ROOT = Path(__file__).resolve().parents[3]
PROBE = """
import sys
import torch
from training import cpu_mode
compile_ = torch.compile
cpu_mode.import_megatron_core()
import training.engine, models.gpt
from megatron.core.fusions import fused_bias_swiglu
assert torch.compile is compile_, "torch.compile is left replaced"
assert "torch._inductor.compile_fx" not in sys.modules, "Inductor was imported"
assert type(fused_bias_swiglu.swiglu).__name__ == "function", type(fused_bias_swiglu.swiglu)
print("ok")
"""


def test_a_cpu_rank_imports_megatron_core_without_the_compiler() -> None:
    done = children.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
