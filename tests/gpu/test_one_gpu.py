"""What one GPU can run that tests/gpu/test_gpu.py does not: FP16 with its loss scale, MoE with the
alltoall dispatcher at EP=1, Megatron-FSDP (with FP8 where the GPU has it) and its checkpoint, CPU
activation offloading (with Transformer Engine), the experts' fused grouped MLP (Blackwell), LLaVA
through Energon, and SDPA on its fused kernels.

Marked `gpu`: skipped where torch sees no CUDA device. `make gpu-check` runs them on a lent GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.gpu.test_gpu import CUDA, assert_learns
from tests.smoke.conftest import REPO, Runs, _env, resolved_config
from tests.smoke.run_many import read_metrics
from tests.support import children

pytestmark = pytest.mark.gpu


def test_fp16_on_one_gpu_trains_with_its_loss_scale(runs: Runs) -> None:
    records = runs.metrics("gpu_fp16", 1, [*CUDA, "precision=fp16_mixed"])
    assert_learns(records)
    assert not any(r.get("skipped") for r in records[-5:]), "the loss scale never settled"


def test_moe_alltoall_dispatcher_at_ep1(runs: Runs) -> None:
    """The GPU's dispatcher (the CPU mode runs allgather only), all experts on the one rank."""
    moe = ["model.num_moe_experts=4", "model.moe_router_topk=2", "model.moe_ffn_hidden_size=64"]
    moe += ["model.moe_token_dispatcher_type=alltoall", "parallel.expert_model_parallel_size=1"]
    assert_learns(runs.metrics("gpu_moe_ep1", 1, [*CUDA, *moe]))


def test_fused_grouped_mlp_trains_as_the_unfused_experts(runs: Runs) -> None:
    """Transformer Engine's fused grouped MLP (model.moe_fused_grouped_mlp, Blackwell): the
    experts' FC1, SwiGLU and FC2 as one op, with the losses of the unfused grouped GEMMs."""
    import torch

    pytest.importorskip("transformer_engine")
    if torch.cuda.get_device_capability() < (10, 0):
        pytest.skip("the CuTe DSL kernel needs Blackwell (sm100+)")
    moe = [*CUDA, "model.num_moe_experts=4", "model.moe_router_topk=2"]
    moe += ["model.moe_ffn_hidden_size=64", "model.moe_grouped_gemm=true"]
    moe += ["model.moe_token_dispatcher_type=alltoall", "parallel.expert_model_parallel_size=1"]
    base = runs.metrics("gpu_moe_grouped", 1, moe)
    fused = runs.metrics("gpu_moe_fused", 1, [*moe, "model.moe_fused_grouped_mlp=true"])
    for a, b in zip(fused, base, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-2), a["step"]
    assert_learns(fused)


def test_megatron_fsdp_on_one_gpu_matches_ddp_and_saves(runs: Runs) -> None:
    """Megatron-FSDP on CUDA streams (the CPU mode replaces them): the same losses as Megatron
    DDP, and an fsdp_dtensor checkpoint at the end; with FP8 current scaling on Hopper and later."""
    import torch

    fsdp = [*CUDA, "parallel.use_megatron_fsdp=true"]
    ddp_records = runs.metrics("gpu_ddp_bf16", 1, CUDA)
    fsdp_records = runs.metrics("gpu_fsdp_bf16", 1, fsdp)
    for a, b in zip(fsdp_records, ddp_records, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-2), a["step"]
    assert_learns(fsdp_records)
    run = runs.root / "gpu_fsdp_bf16" / "run" / "checkpoints"
    assert any(run.glob("iter_*/*.distcp")), "no fsdp_dtensor checkpoint"
    if torch.cuda.get_device_capability() >= (9, 0):
        preset = "precision=bf16_with_fp8_current_scaling_mixed"
        assert_learns(runs.metrics("gpu_fsdp_fp8", 1, [*fsdp, preset]))


def test_cpu_activation_offloading_trains_as_without(runs: Runs) -> None:
    """Transformer Engine's offload hooks (model.cpu_offloading_num_layers): the first layers'
    activations go to the host and back, and the losses are the run's without offloading."""
    pytest.importorskip("transformer_engine")
    base = runs.metrics("gpu_ddp_bf16", 1, CUDA)
    offloaded = runs.metrics("gpu_offload_bf16", 1, [*CUDA, "model.cpu_offloading_num_layers=2"])
    for a, b in zip(offloaded, base, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-2), a["step"]
    assert_learns(offloaded)


def test_llava_trains_on_one_gpu(tmp_path: Path) -> None:
    """tiny_llava_pretrain through Energon on one GPU: the loss falls as on the CPU."""
    from recipes.cli import main as recipes_main

    data = tmp_path / "vlm"
    assert recipes_main(["data", "make-synthetic-vlm", str(data), "--samples", "128"]) == 0
    config = resolved_config(tmp_path, "tiny_llava_pretrain")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    cmd += ["-m", "training.entry", "--config", str(config), "train.device=cuda"]
    cmd += [f"data.path={data}", f"data.tokenizer={data / 'tokenizer.json'}"]
    cmd += [
        f"logging.run_dir={tmp_path / 'run'}",
        "train.max_steps=20",
        "train.global_batch_size=4",
    ]
    proc = children.run(cmd, cwd=REPO, env=_env(tmp_path), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    losses = [r["loss"] for r in read_metrics(tmp_path / "run")]
    assert len(losses) == 20 and sum(losses[:3]) / 3 - sum(losses[-3:]) / 3 > 1.0, losses


@pytest.mark.parametrize("groups", [32, 8], ids=["mha", "gqa"])
def test_sdpa_attention_runs_on_fused_kernels(groups: int) -> None:
    """The engine's SDPA core attention at the proxy's head shape (BF16, causal, 32 heads of 128)
    runs with only the flash / cuDNN / memory-efficient kernels allowed (no math fallback, which
    would make it as slow as the local attention) and matches the math kernel."""
    import torch
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from models.sdpa import SdpaAttention

    config = TransformerConfig(
        num_layers=1,
        hidden_size=4096,
        num_attention_heads=32,
        num_query_groups=groups,
        kv_channels=128,
        bf16=True,
        params_dtype=torch.bfloat16,
    )
    attention = SdpaAttention(config, 1, AttnMaskType.causal, "self")
    seq = 2048
    q = torch.randn(seq, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(seq, 1, groups, 128, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    fused.append(SDPBackend.EFFICIENT_ATTENTION)
    with sdpa_kernel(fused):
        out = attention(q, k, v, None)
    with sdpa_kernel([SDPBackend.MATH]):
        reference = attention(q, k, v, None)
    assert out.shape == (seq, 1, 32 * 128)
    torch.testing.assert_close(out, reference, atol=2e-2, rtol=2e-2)
