"""The memory estimate against the peaks Megatron-LM measured on its own functional tests
(tests/support/megatron_memory.py): 22 runs on H100s, 20 of them also on GB200s and two on A100s,
from a 12-layer GPT of 512 to a 7B of 4096 at 8k tokens, over TP, PP, interleaving, CP, SP, the
distributed optimizer, full recompute, the fused loss and MoE with EP, ETP and grouped GEMMs.

The allocator's peak counts tensors and the cuBLAS and TE workspaces; the estimate's OVERHEAD_GIB
holds those workspaces (about 0.4 GiB of its 3) with what no allocator sees. So the tensors the
estimate counts must come within WORKSPACE_GIB below the measured peak, and neither side may be
off by more than RELATIVE of it.
"""

from __future__ import annotations

import pytest

from config.cost.memory import OVERHEAD_GIB, estimate_memory
from config.rules import derive
from tests.support.megatron_memory import (
    EP_ALLGATHER,
    GIB,
    RUNS,
    MeasuredRun,
    configured,
    estimated,
    fused_loss,
    overrides,
    short,
)

WORKSPACE_GIB = 0.4  # OVERHEAD_GIB's cuBLAS/TE workspaces (config/cost/memory.py)
RELATIVE = 0.03

MEASURED = [(run, kind) for run in RUNS for kind in run.peak_bytes]


@pytest.mark.parametrize(
    ("run", "kind"), MEASURED, ids=[f"{short(r.case)}-{k}" for r, k in MEASURED]
)
def test_the_estimate_meets_the_measured_peak(run: MeasuredRun, kind: str) -> None:
    peak = run.peak_bytes[kind] / GIB
    mem, tensors = estimated(run, kind)
    gap = peak - tensors
    assert -RELATIVE * peak <= gap <= WORKSPACE_GIB + RELATIVE * peak, (run.case, kind, mem)
    assert mem.total_gib > peak  # with the overhead, never below what was measured
    assert OVERHEAD_GIB > WORKSPACE_GIB


def test_the_fused_loss_holds_four_bytes_a_logit_more() -> None:
    """Two runs that differ only in --cross-entropy-loss-fusion (and determinism): Megatron-Core's
    fused loss peaks 4 bytes per logit above the unfused one, the difference `logit_bytes` prices
    (10 against 6)."""
    runs = {short(r.case): r for r in RUNS}
    fused = runs["mcore_te_tp2_pp2_cross_entropy_loss_fusion"]
    unfused = runs["mcore_te_tp2_pp2_resume_torch_dist"]
    assert fused_loss(fused) and not fused_loss(unfused)
    assert set(fused.flags.split()) - set(unfused.flags.split()) == {"--cross-entropy-loss-fusion"}
    measured = fused.peak_bytes["h100"] - unfused.peak_bytes["h100"]
    mem, _ = estimated(fused, "h100")
    logits = mem.logits_gib * GIB / 10  # one byte a logit
    assert measured == pytest.approx(4 * logits, rel=0.02)


def test_the_held_out_allgather_run_is_what_the_support_module_says() -> None:
    """The one run left out: its gap is over the bound, by about its gathered tokens (12 layers of
    8 x 4096 x 512 BF16 values), so the exclusion stays honest if the estimate changes."""
    peak = EP_ALLGATHER.peak_bytes["h100"] / GIB
    _, tensors = estimated(EP_ALLGATHER, "h100")
    gathered = 12 * 8 * 4096 * 512 * 2 / GIB
    assert peak - tensors > WORKSPACE_GIB + RELATIVE * peak
    assert peak - tensors - gathered == pytest.approx(0.25, abs=0.1)  # the grouped GEMMs' gap


def test_a_flag_the_translation_does_not_read_is_refused() -> None:
    run = next(r for r in RUNS if "cp2" in r.case)
    unfused = MeasuredRun(run.case, run.flags.replace("flash", "unfused"), {}, {})
    offloaded = MeasuredRun(run.case, run.flags + " --fine-grained-activation-offloading", {}, {})
    for bad, flag in ((unfused, "--attention-backend"), (offloaded, "--fine-grained")):
        with pytest.raises(ValueError, match=flag):
            overrides(bad)


def test_the_runs_are_the_configs_megatron_ran() -> None:
    """The translation keeps what sizes memory: the 7B's parameters on the last pipeline rank
    (8 layers of 176.2M and the untied output layer of 131,200 x 4096) and its microbatches."""
    run = next(r for r in RUNS if r.case.endswith("7b_tp1_pp4_memory_speed"))
    cfg, cluster = configured(run, "h100")
    derived = derive(cfg, cluster)
    assert derived.data_parallel_size == 2 and derived.num_microbatches == 4
    assert derived.padded_vocab_size == 131200 and len(derived.pipeline_chunks) == 32
    last = estimate_memory(cfg, cluster, derived, on_rank=3)
    layer = 4096 * (4096 + 2 * 1024) + 4096 + 2048 + 4096 * 4096 + 4096  # QKV, proj, biases
    layer += 2 * 4096 * 16384 + 16384 + 4096 + 4 * 4096  # fc1, fc2, biases, two LayerNorms
    assert last.params_per_gpu == 8 * layer + 131200 * 4096 + 2 * 4096  # + the final LayerNorm
