"""The CPU mode's stand-ins for Gated DeltaNet's fla kernels (training/cpu_mode.py item 7) against
transformers' own torch implementations of Qwen3.5 (the oracle): the causal convolution, the L2
norm and the chunked gated delta rule that Megatron-Core's GatedDeltaNet calls in their place.

The rule runs over 150 positions (three chunks of 64, the last one partial), with more value heads
than key heads (each query/key head serving two value heads, repeated as Megatron-Core's
GatedDeltaNet repeats them before the call).
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
qwen3_5 = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")


def test_causal_conv1d_is_transformers_depthwise_causal_convolution() -> None:
    from training.cpu_mode import causal_conv1d

    torch.manual_seed(0)
    x, weight = torch.randn(2, 50, 24), torch.randn(24, 4)
    ours, state = causal_conv1d(x, weight, None, activation="silu")
    theirs = qwen3_5.causal_conv1d_fn(x.transpose(1, 2), weight, None, activation="silu")
    assert state is None
    torch.testing.assert_close(ours, theirs.transpose(1, 2), rtol=0, atol=0)
    # Causal: the output at a position does not change with what follows it.
    later = x.clone()
    later[:, 30:] += 1.0
    assert torch.equal(causal_conv1d(later, weight, None, "silu")[0][:, :30], ours[:, :30])


def test_l2norm_is_transformers() -> None:
    from training.cpu_mode import l2norm

    x = torch.randn(3, 7, 16)
    torch.testing.assert_close(l2norm(x), qwen3_5.l2norm(x, dim=-1, eps=1e-6), rtol=0, atol=0)


def test_chunked_gated_delta_rule_is_transformers() -> None:
    """What GatedDeltaNet computes on the CPU: fla's l2norm stand-in on q and k, the heads
    repeated, then Megatron-Core's torch_chunk_gated_delta_rule (cpu_mode puts it in place of
    fla's chunk_gated_delta_rule) against transformers' rule with its in-kernel L2 norm."""
    from training import cpu_mode

    cpu_mode.enable()
    from megatron.core.ssm.gated_delta_net import common, gdn

    assert gdn.chunk_gated_delta_rule is common.torch_chunk_gated_delta_rule
    assert gdn.causal_conv1d is cpu_mode.causal_conv1d and common.l2norm is cpu_mode.l2norm
    torch.manual_seed(0)
    b, s, key_heads, value_heads, d = 2, 150, 2, 4, 8
    q, k = torch.randn(b, s, key_heads, d), torch.randn(b, s, key_heads, d)
    v = torch.randn(b, s, value_heads, d)
    g = -2.0 * torch.rand(b, s, value_heads)
    beta = torch.rand(b, s, value_heads)
    theirs, _ = qwen3_5.torch_chunk_gated_delta_rule(
        q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True
    )
    repeat = value_heads // key_heads
    qn = common.l2norm(q).repeat_interleave(repeat, dim=2)
    kn = common.l2norm(k).repeat_interleave(repeat, dim=2)
    ours, state = gdn.chunk_gated_delta_rule(qn, kn, v, g=g, beta=beta)
    assert state is None
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
