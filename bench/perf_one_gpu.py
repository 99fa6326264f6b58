"""The step-time model (config/cost/steptime.py) against the one-GPU proxy that `make gpu-check` measures:
the predicted step of the same shape, the error, and the compute constants that the measurement
implies: whenever a GPU is lent, the one-GPU measurements recalibrate the compute term.

    python bench/perf_one_gpu.py GPU_CHECK.json            # gpu_check.json, as a lent GPU sent it
    python bench/perf_one_gpu.py --proxy P.json [--attention A.json] [--env E.json] [--json OUT]

(`make gpu-check` runs the second form as its `calibrate` step, on the proxy's and the attention
step's files; a file that is missing is a step that did not run.)

Two constants are fitted, each alone with the rest of the table as it is:
- `attention`, from the attention step's SDPA forward + backward of one layer at seq 8192 (the
  model's attention time is inversely proportional to it);
- `gemm_<kind>` (bf16, fp8, fp4 by the run's precision), by bisection until the predicted step of
  the proxy (its layers, 4 microbatches of 8192 tokens) equals the measured median step, with
  `attention` at its fitted value when the attention step ran.

The fitted GEMM rate takes everything the model does not see on that machine: the lent GPU runs
without Transformer Engine (`env.transformer-engine` is null), so norms and activations run
unfused and the fit is a lower bound of the rate TE reaches. Check a fit against the published runs
before moving the table: `python bench/plan_calibration.py --set gemm_bf16=<fit>`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gpu_llama3_8b_proxy import STEPS, proxy_overrides  # noqa: E402

from config.cost import steptime as perf  # noqa: E402
from config.hardware import Cluster, gpu_from_device_name  # noqa: E402
from config.rules import derive  # noqa: E402
from config.tree import apply_overrides  # noqa: E402
from recipes.registry import get  # noqa: E402

RANGE = (0.05, 1.5)  # the fitted fraction of the data-sheet peak is searched in here


def proxy_config(layers: int, precision: str):
    """The TrainingConfig the proxy trained (bench/gpu_llama3_8b_proxy.py)."""
    overrides = proxy_overrides(layers, STEPS, precision, Path("/tmp/proxy"))
    return apply_overrides(get("llama3_8b_pretrain").config(), overrides)


def fit(
    gpu: str,
    precision: str,
    layers: int,
    measured_step_s: float,
    sdpa_fwd_bwd_s: float | None = None,
    constants: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Prediction, error and fitted constants for one measured proxy run."""
    k = dict(constants or perf.VALUES)
    cfg, cluster = proxy_config(layers, precision), Cluster(num_nodes=1, gpus_per_node=1, gpu=gpu)
    derived = derive(cfg, cluster)

    def predict(constants: dict[str, float]) -> perf.StepTime:
        step = perf.predict(cfg, cluster, derived, constants)
        if step is None:
            raise ValueError(f"the step-time model prices nothing on {gpu}")
        return step

    before = predict(k)
    costs = perf.layer_costs(cfg, cluster, derived, k)
    out: dict[str, Any] = {
        "gpu": gpu,
        "precision": precision,
        "layers": layers,
        "measured_step_s": measured_step_s,
        "predicted_step_s": before.seconds,
        "predicted_over_measured": before.seconds / measured_step_s,
        "predicted_terms_s": {name: round(v, 5) for name, v in before.terms.items()},
    }
    if sdpa_fwd_bwd_s:
        model_attention = costs.dense["attention"]  # one layer, one microbatch, fwd + bwd
        k["attention"] *= model_attention / sdpa_fwd_bwd_s
        out |= {"attention_model_s": model_attention, "attention_measured_s": sdpa_fwd_bwd_s}
        out["attention_fit"] = k["attention"]
    name = perf.constant(f"gemm_{perf.gemm_peak(cfg, cluster, derived)[1]}", cluster.spec)
    low, high = RANGE

    def step_s(value: float) -> float:
        return predict({**k, name: value}).seconds

    if not step_s(high) <= measured_step_s <= step_s(low):
        out["gemm_fit"] = None  # not reachable by the GEMM rate alone: the other terms are off
        out["gemm_fit_note"] = (
            f"no {name} in {RANGE} predicts {measured_step_s:.4f} s "
            f"({step_s(high):.4f}-{step_s(low):.4f} s)"
        )
        return out
    for _ in range(60):  # the step shrinks as the rate grows: bisect
        mid = (low + high) / 2
        low, high = (mid, high) if step_s(mid) > measured_step_s else (low, mid)
    out |= {"gemm_constant": name, "gemm_table": k[name], "gemm_fit": (low + high) / 2}
    return out


def from_gpu_check(report: dict[str, Any]) -> list[dict[str, Any]]:
    """A fit per precision the proxy steps measured, from gpu_check.json."""
    steps = report.get("steps", {})
    attention = (steps.get("attention", {}).get("result") or {}).get("sdpa_fwd_bwd_s")
    te = (steps.get("env", {}).get("result") or {}).get("transformer-engine")
    fits = []
    for step in ("proxy", "proxy_fit"):
        for precision, figures in (steps.get(step, {}).get("result") or {}).items():
            fits.append(_one(step, precision, figures, attention) | {"transformer_engine": te})
    return fits


def _one(step: str, precision: str, figures: dict, attention: float | None) -> dict[str, Any]:
    gpu = gpu_from_device_name(figures.get("device", ""))
    if gpu is None or not figures.get("step_time_s"):
        return {"step": step, "precision": precision, "skipped": f"no GPU figures: {figures}"}
    result = fit(gpu, precision, figures["layers"], figures["step_time_s"], attention)
    return {"step": step} | result


def _read(path: Path | None) -> dict[str, Any]:
    return json.loads(path.read_text()) if path and path.exists() else {}


def show(fits: list[dict[str, Any]]) -> str:
    lines = []
    for f in fits:
        if "skipped" in f:
            lines.append(f"{f['step']} {f['precision']}: skipped ({f['skipped']})")
            continue
        line = (
            f"{f['step']} {f['precision']} on {f['gpu']}, {f['layers']} layers: measured "
            f"{f['measured_step_s']:.4f} s, predicted {f['predicted_step_s']:.4f} s "
            f"({f['predicted_over_measured'] - 1:+.1%})"
        )
        if "attention_fit" in f:
            line += f"; attention {perf.VALUES['attention']:.3f} -> {f['attention_fit']:.3f}"
        if f.get("gemm_fit") is not None:
            line += f"; {f['gemm_constant']} {f['gemm_table']:.3f} -> {f['gemm_fit']:.3f}"
        else:
            line += f"; {f.get('gemm_fit_note')}"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gpu_check", nargs="?", type=Path, help="gpu_check.json")
    parser.add_argument("--proxy", type=Path, help="the proxy's --json figures")
    parser.add_argument("--attention", type=Path, help="bench/gpu_attention.py's --json")
    parser.add_argument("--env", type=Path, help="bench/gpu_check_env.py's JSON")
    parser.add_argument("--json", type=Path, help="write the fits here")
    args = parser.parse_args(argv)
    if args.gpu_check:
        fits = from_gpu_check(json.loads(args.gpu_check.read_text()))
    elif args.proxy:
        if not args.proxy.exists():
            sys.exit(f"no proxy figures at {args.proxy}: the proxy step did not run")
        attention = _read(args.attention).get("sdpa_fwd_bwd_s")
        te = _read(args.env).get("transformer-engine")
        proxy = json.loads(args.proxy.read_text())
        fits = [
            _one("proxy", p, figures, attention) | {"transformer_engine": te}
            for p, figures in proxy.items()
        ]
    else:
        parser.error("give gpu_check.json or --proxy")
    print(show(fits))
    if args.json:
        args.json.write_text(json.dumps(fits, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
