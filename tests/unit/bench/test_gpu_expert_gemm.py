"""bench/gpu_expert_gemm.py on the CPU (`make gpu-check` runs it on the lent GPU): every model's
expert GEMMs timed, and the rate the step-time model prices them at, which narrows with the
expert's width as config/cost/steptime.py's gemm_rate says, the same in BF16 and FP8."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.append(str(REPO / "bench"))

import gpu_expert_gemm  # noqa: E402

from config.cost.constants import VALUES  # noqa: E402
from config.cost.steptime import constant  # noqa: E402
from config.hardware import GPUS  # noqa: E402


def test_the_cpu_run_times_every_models_experts(tmp_path: Path) -> None:
    """BF16 and FP8 (torch._scaled_mm on E4M3 copies) for each model, priced as on an H100."""
    out = tmp_path / "result.json"
    argv = ["--device", "cpu", "--gpu", "h100", "--tokens", "16", "--scale", "16", "--local", "1"]
    argv += ["--warmup", "0", "--iters", "1"]  # CPU FP8 GEMMs are emulated: tiny shapes
    assert gpu_expert_gemm.main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["models"]) == set(gpu_expert_gemm.MODELS)
    for r in report["models"].values():
        for precision in ("bf16", "fp8"):
            assert r[precision]["tflops"] > 0 and 0 < r[precision]["model_of_peak"] < 1
        assert r["fp8_over_bf16"] > 0 and r["model_fp8_over_bf16"] > 1
        assert r["fp8"]["eager_cast_seconds"] > 0


@pytest.mark.parametrize("gpu", ["h100", "h200", "b200"])
def test_the_modelled_rate_narrows_with_the_experts_width(gpu: str) -> None:
    """Qwen3 30B-A3B's 768-wide experts priced at a lower rate than GPT-OSS 120B's 2880-wide
    ones, in either precision, both under the precision's GEMM efficiency."""
    spec = GPUS[gpu]
    wide = gpu_expert_gemm.shapes(gpu_expert_gemm.MODELS["gpt_oss_120b"]())
    narrow = gpu_expert_gemm.shapes(gpu_expert_gemm.MODELS["qwen3_30b_a3b"]())
    for precision in ("bf16", "fp8"):
        rates = [
            gpu_expert_gemm.modelled(spec, 8192, h, f, precision) for h, f, _ in (wide, narrow)
        ]
        efficiency = VALUES[constant(f"gemm_{precision}", spec)]
        assert 0 < rates[1] < rates[0] < efficiency
