"""torchtitan's own Llama 3 on the shape of our one-GPU proxy: tokens/s, BF16, with and without
torch.compile, for the side-by-side comparison (ours must reach 1.15x its tokens/s).

torchtitan's model (its `llama3_configs["8B"]`: hidden 4096, FFN 14336, 32 heads in 8 groups,
vocabulary 128256 -- the proxy's shape) cut to the proxy's number of layers, initialised by
torchtitan, trained the way torchtitan's trainer trains one device: FP32 parameters under
torch.autocast(bfloat16) (its `mixed_precision_param` on a single device), its sum cross-entropy
over the valid tokens, gradient clipping at 1.0, fused AdamW, micro batch 1 and 4 microbatches of
gradient accumulation per step (our proxy's global batch). torch.compile is applied as torchtitan's
`apply_compile` does: each TransformerBlock, fullgraph.

    python bench/torchtitan_compare.py --layers 10 --seq 8192 --steps 20 [--compile] --json out.json
    python bench/torchtitan_compare.py --flavor debugmodel --layers 2 --seq 64 --steps 2 --device cpu

The attention backend is torchtitan's default for language models, FlexAttention ("flex"); its
backward does not run on the CPU, so the CPU check takes torchtitan's SDPA module ("sdpa").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# The proxy's shape (bench/gpu_llama3_8b_proxy.py), checked against torchtitan's 8B config.
PROXY = {"dim": 4096, "ffn": 14336, "heads": 32, "kv_heads": 8, "vocab": 128256}


def allow_torch_2_11() -> None:
    """Let torchtitan 0.3.0 import on torch 2.11, the lent GPU machine's.

    Its FSDP helper, which `torchtitan.models.llama3` imports and this one-device harness never
    calls, imports `torch.distributed.fsdp.DataParallelMeshDims`, which torch 2.11 lacks (first
    in 2.12); no torchtitan release runs Llama 3 on 2.11 with the harness's config API (0.2.2's
    model is configured otherwise and imports `datasets`). An empty class of that name stands in
    where torch has none; the model, its loss and torch.compile are torch 2.11's own."""
    import torch.distributed.fsdp as fsdp

    if not hasattr(fsdp, "DataParallelMeshDims"):
        fsdp.DataParallelMeshDims = type("DataParallelMeshDims", (), {})


def build_model(flavor: str, layers: int, attn: str, device: Any) -> Any:
    """torchtitan's Llama3Model of `flavor` with its first `layers` blocks, initialised on device."""
    import torch

    allow_torch_2_11()
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import llama3_configs

    config = llama3_configs[flavor](attn_backend="flex" if attn == "sdpa" else attn)
    if layers > len(config.layers):
        raise SystemExit(f"--layers {layers}: torchtitan's {flavor} has {len(config.layers)}")
    config.layers = config.layers[:layers]
    if attn == "sdpa":  # torchtitan's own SDPA module (causal), as its Flux model builds it
        for layer in config.layers:
            layer.attention.inner_attention = ScaledDotProductAttention.Config()
    with torch.device(device):
        model = config.build()
    model.init_states(buffer_device=torch.device(device))
    return model


def config_shape(config: Any) -> dict[str, int]:
    """The shape of a torchtitan Llama3Model.Config, in the proxy's terms."""
    attention, ffn = config.layers[0].attention, config.layers[0].feed_forward
    return {
        "dim": config.dim,
        "ffn": ffn.w1.out_features,
        "heads": attention.n_heads,
        "kv_heads": attention.n_kv_heads or attention.n_heads,
        "vocab": config.vocab_size,
    }


def train(
    model: Any,
    *,
    seq: int,
    steps: int,
    microbatches: int,
    compile: bool,
    device: str,
    warmup: int,
) -> dict[str, Any]:
    """`steps` optimizer steps on random tokens; tokens/s is the median after `warmup` steps."""
    import torch
    from torchtitan.components.loss import cross_entropy_loss

    if compile:
        torch._dynamo.config.capture_scalar_outputs = True  # as torchtitan's apply_compile
        for block in model.layers.values():
            block.compile(fullgraph=True)
    cuda = device == "cuda"
    # torchtitan's optimizer defaults: AdamW, lr 8e-4, eps 1e-8, weight decay 0.1, fused.
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=8e-4, eps=1e-8, weight_decay=0.1, fused=cuda, foreach=not cuda
    )
    vocab = model.config.vocab_size
    positions = torch.arange(seq, device=device).unsqueeze(0)
    needs_masks = hasattr(model, "get_attention_masks") and not _is_sdpa(model)
    masks = model.get_attention_masks(positions=positions) if needs_masks else None
    generator = torch.Generator(device="cpu").manual_seed(0)
    times, losses = [], []
    for _ in range(steps):
        batches = [
            torch.randint(0, vocab, (1, seq + 1), generator=generator).to(device)
            for _ in range(microbatches)
        ]
        start = time.perf_counter()
        total = torch.zeros((), device=device)
        for tokens in batches:
            inputs, labels = tokens[:, :-1], tokens[:, 1:]
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                pred = model(inputs, positions=positions, attention_masks=masks)
            loss = cross_entropy_loss(pred, labels) / (labels.numel() * microbatches)
            del pred
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(total))  # a sync: the step is done
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    measured = times[warmup:] or times
    step_s = statistics.median(measured)
    result: dict[str, Any] = {
        "tokens_per_s": seq * microbatches / step_s,
        "step_time_s": step_s,
        "first_step_s": times[0],
        "losses": losses,
    }
    if cuda:
        result["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return result


def _is_sdpa(model: Any) -> bool:
    from torchtitan.models.common.attention import ScaledDotProductAttention

    block = next(iter(model.layers.values()))
    return isinstance(block.attention.inner_attention, ScaledDotProductAttention)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torchtitan

    torch.manual_seed(0)
    model = build_model(args.flavor, args.layers, args.attn, args.device)
    shape = config_shape(model.config)
    if args.flavor == "8B" and shape != PROXY:
        raise SystemExit(f"torchtitan's 8B shape {shape} is not the proxy's {PROXY}")
    figures = train(
        model,
        seq=args.seq,
        steps=args.steps,
        microbatches=args.microbatches,
        compile=args.compile,
        device=args.device,
        warmup=args.warmup,
    )
    return {
        "torchtitan": getattr(torchtitan, "__version__", None) or _version("torchtitan"),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "flavor": args.flavor,
        "layers": args.layers,
        "seq": args.seq,
        "microbatches": args.microbatches,
        "attn": args.attn,
        "compile": args.compile,
        "shape": shape,
        "parameters": sum(p.numel() for p in model.parameters()),
        **figures,
    }


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flavor", default="8B", help="torchtitan's llama3 flavor (8B = proxy)")
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--microbatches", type=int, default=4, help="the proxy's GBS 4 at MBS 1")
    parser.add_argument("--attn", choices=["flex", "flex_flash", "varlen", "sdpa"], default="flex")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", type=Path, help="write the figures here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    result = run(args)
    line = {k: v for k, v in result.items() if k != "losses"}
    print(json.dumps(line))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
