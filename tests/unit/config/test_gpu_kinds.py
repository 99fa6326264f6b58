"""GPU kinds: what torch reports each part as, their peaks and formats, and the checker's message
for a kind it does not know."""

from __future__ import annotations

import pytest

from config.hardware import Cluster
from config.rules import validate
from config.tree import apply_overrides
from tests.unit.config.test_validation import llama_like

# What torch.cuda.get_device_name() returns on each part, as public job logs and nvidia-smi show it.
DEVICE_NAMES = [
    ("NVIDIA GH200 480GB", "gh200"),  # GH200 96 GB with 480 GB LPDDR5X (CoreWeave, Isambard)
    ("NVIDIA GH200 120GB", "gh200"),  # GH200 96 GB with 120 GB LPDDR5X (Alps, JUPITER)
    ("NVIDIA GH200 144G HBM3e", "gh200-144g"),
    ("NVIDIA A100-SXM-64GB", "a100-64g"),  # Leonardo Booster
    ("NVIDIA A100-SXM4-40GB", "a100-40g"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA B200", "b200"),
    ("AMD Instinct MI250X", None),
]


@pytest.mark.parametrize(("name", "kind"), DEVICE_NAMES)
def test_gpu_from_device_name(name: str, kind: str | None) -> None:
    from config.hardware import gpu_from_device_name

    assert gpu_from_device_name(name) == kind


def test_new_kinds_peaks_and_formats() -> None:
    """GH200 computes as H100 SXM (FP8 with block scaling, no MXFP8); Leonardo's A100 as A100."""
    from config.hardware import GPUS
    from config.precision import PRESETS, gpu_runs

    fp8, mx = PRESETS["bf16_with_fp8_subchannel_scaling_mixed"], PRESETS["bf16_with_mxfp8_mixed"]
    for kind in ("gh200", "gh200-144g"):
        spec, h100 = GPUS[kind], GPUS["h100"]
        assert (spec.bf16_tflops, spec.fp8_tflops) == (h100.bf16_tflops, h100.fp8_tflops)
        assert gpu_runs(spec, fp8) and not gpu_runs(spec, mx)
        assert spec.network_gb_s == 25
    a100 = GPUS["a100-64g"]
    assert (a100.bf16_tflops, a100.fp8_tflops, a100.network_gb_s) == (312.0, None, 12.5)
    assert not gpu_runs(a100, fp8)
    assert GPUS["a100-40g"].memory_gib < a100.memory_gib < GPUS["a100"].memory_gib
    assert GPUS["h100"].memory_gib < GPUS["gh200"].memory_gib < GPUS["gh200-144g"].memory_gib


@pytest.mark.parametrize("kind", ["gh200", "gh200-144g"])
def test_fp8_on_gh200_is_accepted(kind: str) -> None:
    cfg = llama_like()
    apply_overrides(cfg, ["precision=bf16_with_fp8_current_scaling_mixed"])
    assert validate(cfg, Cluster(num_nodes=2, gpus_per_node=4, gpu=kind)) == []


def test_unknown_gpu_kind_message() -> None:
    """The field, the value, the known kinds; for AMD parts, why (ROCm); else a close name."""
    from config.hardware import GPUS, gpu_kind_problem

    problems = validate(llama_like(), Cluster(gpu="mi250x", gpus_per_node=4))
    (message,) = [p.message for p in problems if p.field == "cluster.gpu"]
    assert "'mi250x'" in message and "ROCm" in message and all(k in message for k in GPUS)
    assert "ROCm" in (gpu_kind_problem("MI300X") or "")
    typo = gpu_kind_problem("gh-200") or ""
    assert "ROCm" not in typo and "Did you mean 'gh200'" in typo
    assert gpu_kind_problem("cpu") is None and all(gpu_kind_problem(k) is None for k in GPUS)
