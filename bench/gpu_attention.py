"""The SDPA core attention (models/specs.py) against the unfused local attention it replaced.

Without Transformer Engine the engine computes attention with torch's scaled_dot_product_attention
(flash / cuDNN kernels) instead of Megatron-Core's DotProductAttention (an explicit softmax over
the [heads, seq, seq] scores). This times both modules, forward + backward, on the proxy's layer
(seq 8192, 32 heads in 8 groups of 128, BF16, micro batch 1), and, given the proxy's step time,
the share of a step each would take:

    share = layers * microbatches * attention_time / step_time

    python bench/gpu_attention.py [--seq 8192] [--step-s S --layers L --microbatches 4] [--json F]
    python bench/gpu_attention.py --device cpu --seq 128 --heads 4 --groups 2 --head-dim 16
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.gpu_timing import median_seconds  # noqa: E402


def init_single_process(device: str) -> None:
    """A one-rank process group and Megatron's parallel state (TP = PP = 1)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if device == "cpu":  # Megatron-Core's CUDA calls, redirected as in the engine's CPU mode
        from training import cpu_mode

        cpu_mode.enable()
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    from megatron.core import tensor_parallel

    tensor_parallel.model_parallel_cuda_manual_seed(0)  # the local attention forks its RNG


def modules(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from models.sdpa import SdpaAttention

    config = TransformerConfig(
        num_layers=1,
        hidden_size=args.heads * args.head_dim,
        num_attention_heads=args.heads,
        num_query_groups=args.groups,
        kv_channels=args.head_dim,
        bf16=True,
        params_dtype=torch.bfloat16,
        attention_dropout=0.0,
        masked_softmax_fusion=False,  # no Apex / TE kernels here: the local path as it runs
    )
    causal = AttnMaskType.causal
    return {
        "sdpa": SdpaAttention(config, 1, causal, "self"),
        "local": DotProductAttention(config, 1, causal, "self"),
    }


def time_module(module: Any, args: argparse.Namespace) -> float:
    """Median seconds of forward + backward over args.iters calls after args.warmup."""
    import torch

    device, dtype = args.device, torch.bfloat16
    q = torch.randn(args.seq, 1, args.heads, args.head_dim, device=device, dtype=dtype)
    k = torch.randn(args.seq, 1, args.groups, args.head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    for t in (q, k, v):
        t.requires_grad_(True)

    def step() -> None:
        q.grad = k.grad = v.grad = None
        out = module(q, k, v, None)
        out.backward(torch.ones_like(out))

    return median_seconds(step, device, args.warmup, args.iters)


def agreement(pair: dict[str, Any], args: argparse.Namespace) -> float:
    """Largest difference between the two outputs on the same inputs (both BF16)."""
    import torch

    torch.manual_seed(0)
    shape = (args.seq, 1, args.heads, args.head_dim)
    q = torch.randn(*shape, device=args.device, dtype=torch.bfloat16)
    k, v = (
        torch.randn(
            *shape[:2], args.groups, args.head_dim, device=args.device, dtype=torch.bfloat16
        )
        for _ in "kv"
    )
    with torch.no_grad():
        outs = [pair[name](q, k, v, None).float() for name in ("sdpa", "local")]
    return (outs[0] - outs[1]).abs().max().item()


def shares(times: dict[str, float], step_s: float | None, layers: int, micro: int) -> dict:
    """Each attention's share of the step: measured with SDPA, and what the local one would take
    (the step with SDPA's time swapped for the local time)."""
    if not step_s:
        return {}
    calls = layers * micro
    sdpa, local = times["sdpa"], times["local"]
    local_step = step_s + calls * (local - sdpa)
    return {
        "sdpa_share_of_step": calls * sdpa / step_s,
        "local_share_of_step": calls * local / local_step,
        "step_s_with_sdpa": step_s,
        "step_s_with_local_estimated": local_step,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--step-s", type=float, help="the proxy's median step time with SDPA")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    init_single_process(args.device)
    pair = modules(args)
    times = {name: time_module(m, args) for name, m in pair.items()}
    result = {
        "seq": args.seq,
        "device": args.device,
        "max_abs_diff": agreement(pair, args),
        "sdpa_fwd_bwd_s": times["sdpa"],
        "local_fwd_bwd_s": times["local"],
        "local_over_sdpa": times["local"] / times["sdpa"],
        **shares(times, args.step_s, args.layers, args.microbatches),
    }
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
