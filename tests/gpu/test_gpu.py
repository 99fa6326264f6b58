"""What only a GPU can run: TE layers, FP8 presets, sequence and context parallel, SDPA on CUDA.

Marked `gpu`: tests/conftest.py skips them where torch sees no CUDA device. Each launches the same
engine as the CPU smoke tests (`torchrun -m training.entry`) with `train.device=cuda`.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.smoke.conftest import Runs

pytestmark = pytest.mark.gpu


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _capability() -> tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability()


needs_te = pytest.mark.skipif(
    importlib.util.find_spec("transformer_engine") is None, reason="needs Transformer Engine"
)
CUDA = ["train.device=cuda", "optimizer.lr=1e-3"]


def assert_learns(records: list[dict]) -> None:
    losses = [r["loss"] for r in records]
    assert sum(losses[:3]) / 3 - sum(losses[-3:]) / 3 > 0.5, losses


def test_bf16_on_one_gpu_reports_mfu(runs: Runs) -> None:
    """TE spec when TE imports, else the SDPA spec (flash / cuDNN kernels): both must train."""
    records = runs.metrics("gpu_bf16", 1, CUDA)
    assert_learns(records)
    assert records[-1]["mfu"] is not None and 0 < records[-1]["mfu"] < 1


@needs_te
@pytest.mark.parametrize(
    "preset",
    [
        "bf16_with_fp8_delayed_scaling_mixed",
        "bf16_with_fp8_current_scaling_mixed",
        "bf16_with_fp8_subchannel_scaling_mixed",
    ],
)
def test_fp8_presets_train_on_hopper(runs: Runs, preset: str) -> None:
    if _capability() < (9, 0):
        pytest.skip("FP8 needs Hopper (sm90) or newer")
    # FP8 GEMMs want dimensions that are multiples of 16: the tiny model's 64/256 qualify.
    assert_learns(runs.metrics(f"gpu_{preset}", 1, [*CUDA, f"precision={preset}"]))


@needs_te
def test_mxfp8_trains_on_blackwell(runs: Runs) -> None:
    if _capability() < (10, 0):
        pytest.skip("MXFP8 needs Blackwell (sm100)")
    assert_learns(runs.metrics("gpu_mxfp8", 1, [*CUDA, "precision=bf16_with_mxfp8_mixed"]))


def test_sequence_parallel_matches_plain_tensor_parallel(runs: Runs) -> None:
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    tp = ["parallel.tensor_model_parallel_size=2"]
    plain = runs.metrics("gpu_tp2", 2, [*CUDA, *tp])
    sp = runs.metrics("gpu_tp2_sp", 2, [*CUDA, *tp, "parallel.sequence_parallel=true"])
    assert_learns(sp)
    for a, b in zip(plain[:5], sp[:5], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=0.05)


@needs_te
@pytest.mark.parametrize("exchange", ["p2p", "a2a", "all_gather"])
def test_context_parallel_matches_one_gpu(runs: Runs, exchange: str) -> None:
    """CP 2 computes one replica's samples as one GPU does, each rank its zigzag half of every
    sequence (models/gpt.py on_this_cp_rank), with each of Transformer Engine's exchanges
    (parallel.cp_comm_type: keys and values passed around the ring, heads traded for the sequence,
    keys and values gathered): the same losses. (Until 2026-11-28 the CP ranks read other samples
    and attended over whole sequences, and this test only asked that the loss fell.)"""
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    one = runs.metrics("gpu_bf16", 1, CUDA)
    cp = runs.metrics(
        f"gpu_cp2_{exchange}",
        2,
        [*CUDA, "parallel.context_parallel_size=2", f"parallel.cp_comm_type={exchange}"],
    )
    assert_learns(cp)
    for a, b in zip(one[:5], cp[:5], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=0.05)


@needs_te
@pytest.mark.parametrize("exchange", ["a2a", "all_gather"])
def test_context_parallel_runs_windows_as_one_gpu(runs: Runs, exchange: str) -> None:
    """A windowed model (every other layer sees 15 tokens back, as GPT-OSS's do 127) on CP 2, on
    the exchanges Transformer Engine runs windows with (the ring cannot: `recipes check` refuses
    it), trains the losses one GPU does."""
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    window = ["model.window_size=15", "model.window_attn_skip_freq=2"]
    one = runs.metrics("gpu_window", 1, [*CUDA, *window])
    cp = runs.metrics(
        f"gpu_cp2_window_{exchange}",
        2,
        [*CUDA, *window, "parallel.context_parallel_size=2", f"parallel.cp_comm_type={exchange}"],
    )
    assert_learns(cp)
    for a, b in zip(one[:5], cp[:5], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=0.05)


def test_moe_alltoall_dispatcher(runs: Runs) -> None:
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    moe = ["model.num_moe_experts=4", "model.moe_router_topk=2", "model.moe_ffn_hidden_size=64"]
    assert_learns(
        runs.metrics("gpu_moe_a2a", 2, [*CUDA, *moe, "parallel.expert_model_parallel_size=2"])
    )


def test_moe_alltoall_overlap_matches_the_plain_schedule(runs: Runs) -> None:
    """parallel.overlap_moe_expert_parallel_comm runs Megatron-Core's combined 1F1B schedule (the
    model's schedule plan, models/gpt.py): the same computation, reordered, so the same losses."""
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    moe = ["model.num_moe_experts=4", "model.moe_router_topk=2", "model.moe_ffn_hidden_size=64"]
    moe += ["parallel.expert_model_parallel_size=2", "model.moe_token_dispatcher_type=alltoall"]
    moe += ["train.micro_batch_size=1"]  # 4 microbatches per rank: the schedule pairs them
    plain = runs.metrics("gpu_moe_plain", 2, [*CUDA, *moe])
    overlap = runs.metrics(
        "gpu_moe_overlap", 2, [*CUDA, *moe, "parallel.overlap_moe_expert_parallel_comm=true"]
    )
    assert_learns(overlap)
    for a, b in zip(plain[:5], overlap[:5], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=0.02)


def test_packed_sft_keeps_te_linears_and_learns(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Packed SFT rows carry a block-diagonal mask: with TE, the layers keep TE's linear layers and
    take the SDPA core attention, which applies the mask (models/specs.py); the loss must fall."""
    from models.sdpa import SdpaAttention
    from models.specs import decoder_block_spec, have_transformer_engine
    from tests.smoke.test_sft_cpu import SftRuns

    if have_transformer_engine():
        from megatron.core.transformer.transformer_config import TransformerConfig

        config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4)
        spec = decoder_block_spec(config, "te", "RMSNorm", None, masked=True)
        attention = spec.layer_specs[0].submodules.self_attention.submodules
        assert attention.core_attention is SdpaAttention
        assert "TE" in attention.linear_qkv.__name__
    runs = SftRuns(tmp_path_factory.mktemp("gpu_sft"))
    tp = ["parallel.tensor_model_parallel_size=1"]  # one process per GPU: TP=1 on one GPU
    runs.run("gpu_sft", ["train.max_steps=20", *tp], "cuda", nproc=1)
    losses = runs.losses("gpu_sft")
    assert losses[-1] < losses[0] - 3.0, losses
