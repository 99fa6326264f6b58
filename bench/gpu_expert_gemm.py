"""An MoE layer's expert GEMMs as Transformer Engine's grouped GEMM runs them (one cuBLAS GEMM per
local expert), timed on one GPU in BF16 and FP8, against the rate the step-time model prices.

The model prices an expert GEMM of T tokens, hidden h and expert width f at its precision's rate
over (1 + d0/T + expert_half_dim/f + d0/h) (config/cost/steptime.py gemm_rate): the same factor in
BF16 and FP8. The published MoE runs gain less from FP8 than it prices (bench/plan_calibration.py
--table: the MoE FP8-over-BF16 pairs' mean error is +19%), and GPT-OSS 120B (h = f = 2880) runs at
half the BF16 MFU of Qwen3 and DeepSeek-V3, whose experts are narrower. Per model of the catalog,
the forward FC1 (gated: 2f wide) and FC2 of `--local` experts of `--tokens` tokens each:

- bf16: torch.matmul, expert after expert;
- fp8: torch._scaled_mm on E4M3 copies with per-tensor scales, the GEMMs alone, and the eager
  cast of the inputs (amax, scale, cast: more kernels than TE's fused one, so an upper bound);

each as TFLOPS, its fraction of the data-sheet peak (config/hardware.py) and the model's.

    python bench/gpu_expert_gemm.py [--tokens 8192] [--local 4] [--json F]
    python bench/gpu_expert_gemm.py --device cpu --gpu h100 --tokens 16 --scale 16 --local 1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_timing import median_seconds  # noqa: E402
from config.cost.constants import VALUES  # noqa: E402
from config.cost.steptime import constant, gemm_rate, large_gemm_tflops  # noqa: E402
from config.hardware import GPUS, GpuSpec, gpu_from_device_name  # noqa: E402
from config.schema import ModelConfig, is_gated  # noqa: E402
from models.presets.deepseek import deepseek_v3  # noqa: E402
from models.presets.gpt_oss import gpt_oss_120b  # noqa: E402
from models.presets.mixtral import mixtral_8x7b  # noqa: E402
from models.presets.qwen import qwen3_30b_a3b  # noqa: E402

MODELS = {
    "gpt_oss_120b": gpt_oss_120b,
    "qwen3_30b_a3b": qwen3_30b_a3b,
    "deepseek_v3": deepseek_v3,
    "mixtral_8x7b": mixtral_8x7b,
}


def shapes(m: ModelConfig, scale: int = 1) -> tuple[int, int, int]:
    """(hidden, expert width, FC1's width): FC1 is twice as wide for a gated activation."""
    h, f = m.hidden_size // scale, (m.moe_ffn_hidden_size or m.ffn_hidden_size) // scale
    return h, f, 2 * f if is_gated(m) else f


def modelled(spec: GpuSpec, tokens: int, h: int, f: int, precision: str) -> float:
    """The fraction of the precision's peak the model prices an expert's GEMMs at (FC1 and FC2
    share the expert's width, and so the factor)."""
    k = VALUES
    peak = spec.bf16_tflops if precision == "bf16" else spec.fp8_tflops or 0.0
    rate = large_gemm_tflops(precision, spec, 1.0)  # a fraction of the peak
    half, own = k[constant("gemm_half_dim", spec)], k[constant("expert_half_dim", spec)]
    return gemm_rate(rate, tokens, f, h, half, own) if peak else 0.0


def measure(m: ModelConfig, args: argparse.Namespace, spec: GpuSpec | None) -> dict[str, Any]:
    """One model's expert GEMMs timed in BF16 and, where `spec` has FP8, in FP8, with the
    fractions of `spec`'s peaks they reach and the model prices (none without a `spec`)."""
    import torch

    h, f, fc1 = shapes(m, args.scale)
    t, n, dev = args.tokens, args.local, args.device
    dtype = torch.bfloat16
    x = [torch.randn(t, h, device=dev, dtype=dtype) for _ in range(n)]
    mid = [torch.randn(t, f, device=dev, dtype=dtype) for _ in range(n)]
    w1 = [torch.randn(fc1, h, device=dev, dtype=dtype) / h**0.5 for _ in range(n)]
    w2 = [torch.randn(h, f, device=dev, dtype=dtype) / f**0.5 for _ in range(n)]
    flops = 2 * t * (h * fc1 + f * h) * n

    def bf16() -> None:
        for i in range(n):
            torch.matmul(x[i], w1[i].t())
            torch.matmul(mid[i], w2[i].t())

    out: dict[str, Any] = {"hidden": h, "expert_width": f, "tokens": t, "local_experts": n}
    seconds = median_seconds(bf16, dev, args.warmup, args.iters)
    out["bf16"] = {"seconds": seconds, "tflops": flops / seconds / 1e12}
    if hasattr(torch, "_scaled_mm") and spec is not None and spec.fp8_tflops:
        e4m3 = torch.float8_e4m3fn

        def cast(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            amax = a.abs().amax().float().clamp(min=1e-12)
            return (a.float() * (448.0 / amax)).to(e4m3), amax / 448.0

        qx, qmid = [cast(a) for a in x], [cast(a) for a in mid]
        qw1, qw2 = [cast(w) for w in w1], [cast(w) for w in w2]

        def fp8() -> None:
            for i in range(n):
                a, sa = qx[i]
                b, sb = qw1[i]
                torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=dtype)
                a, sa = qmid[i]
                b, sb = qw2[i]
                torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=dtype)

        def casts() -> None:
            for i in range(n):
                cast(x[i])
                cast(mid[i])

        seconds = median_seconds(fp8, dev, args.warmup, args.iters)
        out["fp8"] = {"seconds": seconds, "tflops": flops / seconds / 1e12}
        out["fp8"]["eager_cast_seconds"] = median_seconds(casts, dev, args.warmup, args.iters)
    if spec is not None:
        for precision in ("bf16", "fp8"):
            if precision in out:
                peak = spec.bf16_tflops if precision == "bf16" else spec.fp8_tflops
                out[precision]["of_peak"] = out[precision]["tflops"] / peak
                out[precision]["model_of_peak"] = modelled(spec, t, h, f, precision)
        if "fp8" in out and spec.fp8_tflops:
            out["fp8_over_bf16"] = out["bf16"]["seconds"] / out["fp8"]["seconds"]
            model = out["fp8"]["model_of_peak"] * spec.fp8_tflops
            out["model_fp8_over_bf16"] = model / (out["bf16"]["model_of_peak"] * spec.bf16_tflops)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per local expert")
    parser.add_argument("--local", type=int, default=4, help="local experts, GEMM after GEMM")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--scale", type=int, default=1, help="divide the widths (CPU plumbing)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--gpu", help="the GPU kind to price against (default: this one's)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    import torch

    kind = args.gpu
    if kind is None and args.device == "cuda":
        kind = gpu_from_device_name(torch.cuda.get_device_name())
    spec = GPUS[kind] if kind else None
    report: dict[str, Any] = {"gpu": spec.name if spec else args.device, "models": {}}
    for name in args.models.split(","):
        r = report["models"][name] = measure(MODELS[name](), args, spec)
        line = f"{name:<14} h {r['hidden']:>5}  f {r['expert_width']:>5}  "
        line += f"bf16 {r['bf16']['tflops']:7.1f} TFLOPS"
        if "of_peak" in r["bf16"]:
            line += f" ({r['bf16']['of_peak']:.0%}, model {r['bf16']['model_of_peak']:.0%})"
        if "fp8" in r:
            line += f"  fp8 {r['fp8']['tflops']:7.1f} ({r['fp8']['of_peak']:.0%}, model "
            line += f"{r['fp8']['model_of_peak']:.0%})  fp8/bf16 {r['fp8_over_bf16']:.2f}x "
            line += f"(model {r['model_fp8_over_bf16']:.2f}x)"
        print(line, flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
