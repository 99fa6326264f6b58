"""Everything measured on one lent GPU, in one command of at most 10 minutes, and the
step-time model of `recipes plan` held against it (the `calibrate` step).

Run by scripts/gpu_check.sh (`make gpu-check`), which first installs the carried wheels into a
folder on PYTHONPATH. Each STEP runs as a subprocess with its own time budget, cut to what is left
of the whole run's deadline; a step that finds too little time is recorded as not run, with the
command that runs it alone. Written under --out ($OUT on the lent machine, which sends back at most
8 files): gpu_check.json (every figure), summary.md (the headline figures, each step's status and
command), logs.tar.gz (each step's log and JSON) and, from scripts/gpu_check.sh, console.log.

    python bench/gpu_check.py --out DIR [--only proxy,torchtitan_eager] [--deadline-s 540]
    python bench/gpu_check.py --out DIR --cpu-dry-run     # the plumbing, tiny shapes, on the CPU
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
# The proxy shape both engines train in the comparison: 6 of Llama 3 8B's layers fit torchtitan's
# FP32 parameters + AdamW (16 bytes per parameter) and its activations on an 80 GB H100.
LAYERS = 6


@dataclass(frozen=True)
class Step:
    name: str
    budget_s: float  # the most it may take; cut to the run's deadline
    gpu: list[str]  # the command on the GPU ({out} is the step's folder, {layers} LAYERS)
    cpu: list[str]  # the same plumbing on the CPU, tiny


TITAN = [PY, "bench/torchtitan_compare.py", "--json", "{out}/result.json"]
TITAN_CPU = [*TITAN, "--device", "cpu", "--flavor", "debugmodel", "--layers", "2", "--seq", "64"]
TITAN_CPU += ["--steps", "2", "--warmup", "1", "--attn", "sdpa"]
CALIBRATE = [PY, "bench/perf_one_gpu.py", "--proxy", "{root}/proxy/result.json"]
CALIBRATE += ["--attention", "{root}/attention/result.json", "--env", "{root}/env/result.json"]
CALIBRATE += ["--json", "{out}/result.json"]
STEPS = [
    Step("env", 30, *[[PY, "bench/gpu_check_env.py", "{out}/result.json"]] * 2),
    Step(
        "proxy",
        100,
        [PY, "bench/gpu_llama3_8b_proxy.py", "--precision", "bf16_mixed", "--steps", "15"]
        + ["--layers", "{layers}", "--json", "{out}/result.json"],
        [PY, "bench/gpu_llama3_8b_proxy.py", "--precision", "bf16_mixed", "--steps", "3"]
        + ["--layers", "2", "--json", "{out}/result.json", "--cpu-dry-run"],
    ),
    Step("torchtitan_eager", 90, [*TITAN, "--layers", "{layers}", "--steps", "12"], [*TITAN_CPU]),
    Step(
        "torchtitan_compile",
        130,
        [*TITAN, "--layers", "{layers}", "--steps", "12", "--compile"],
        [*TITAN_CPU, "--compile"],
    ),
    Step(
        "attention",
        40,
        [PY, "bench/gpu_attention.py", "--json", "{out}/result.json", "--layers", "{layers}"]
        + ["--step-s", "{proxy_step_s}"],
        [PY, "bench/gpu_attention.py", "--json", "{out}/result.json", "--device", "cpu"]
        + ["--seq", "128", "--heads", "4", "--groups", "2", "--head-dim", "16", "--iters", "2"]
        + ["--layers", "2", "--step-s", "{proxy_step_s}"],
    ),
    # An MoE layer's expert GEMMs in BF16 and FP8 against the rates the step-time model prices.
    Step(
        "expert_gemm",
        40,
        [PY, "bench/gpu_expert_gemm.py", "--json", "{out}/result.json"],
        [PY, "bench/gpu_expert_gemm.py", "--device", "cpu", "--gpu", "h100", "--tokens", "16"]
        + ["--scale", "16", "--local", "1", "--warmup", "0", "--iters", "1"]
        + ["--json", "{out}/result.json"],
    ),
    # The step-time model against the proxy and attention just measured (CPU only, seconds).
    Step("calibrate", 30, *[CALIBRATE] * 2),
    Step(
        "memory",
        150,
        [PY, "bench/gpu_memory.py", "--out", "{out}", "--budget-s", "140"],
        [PY, "bench/gpu_memory.py", "--out", "{out}", "--cpu-dry-run"],
    ),
    Step(
        "async_save",
        150,
        [PY, "bench/gpu_async_save.py", "--out", "{out}"],
        [PY, "bench/gpu_async_save.py", "--out", "{out}", "--cpu-dry-run"],
    ),
    Step(
        "pytest",
        300,
        [PY, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-rs", "-p", "no:cacheprovider"]
        + ["--junitxml", "{out}/junit.xml"],
        [PY, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-rs", "-p", "no:cacheprovider"]
        + ["--junitxml", "{out}/junit.xml"],
    ),
    # The MFU figure at as many layers as the memory estimate fits (the proxy step uses LAYERS,
    # the shape torchtitan can hold too).
    Step(
        "proxy_fit",
        100,
        [PY, "bench/gpu_llama3_8b_proxy.py", "--precision", "bf16_mixed", "--steps", "15"]
        + ["--json", "{out}/result.json"],
        [],
    ),
]
MIN_S = 20.0  # a step given less than this is not started
CPU_SLOWER = 6  # the dry run's budgets: the GPU's times this
GRACE_S = 10.0  # between a step's SIGINT at its budget and the SIGKILL


def command(step: Step, cpu: bool, out: Path, figures: dict[str, Any]) -> list[str]:
    proxy = figures.get("proxy", {}).get("result", {}).get("bf16_mixed", {})
    values = {
        "out": str(out),
        "root": str(out.parent),
        "layers": str(LAYERS),
        "proxy_step_s": str(proxy.get("step_time_s") or 0),
    }
    return [part.format(**values) for part in (step.cpu if cpu else step.gpu)]


def run_step(step: Step, cpu: bool, root: Path, figures: dict, deadline: float) -> dict[str, Any]:
    """One step: its command under its budget; the JSON it wrote, or why there is none."""
    out = root / step.name
    out.mkdir(parents=True, exist_ok=True)
    cmd = command(step, cpu, out, figures)
    left = deadline - time.monotonic()
    # Two shared CPU cores start Python, torch and Megatron-Core far slower than the GPU machine.
    budget = min(step.budget_s * (CPU_SLOWER if cpu else 1), left - GRACE_S)
    record: dict[str, Any] = {"command": " ".join(cmd)}
    if not cmd:
        return record | {"status": "not run: nothing to do on the CPU"}
    if budget < MIN_S:
        return record | {"status": f"not run: {left:.0f} s left of the run's deadline"}
    start = time.monotonic()
    log = out / "log.txt"
    # On two shared cores a process's own thread pool only oversubscribes them.
    env = os.environ | ({"OMP_NUM_THREADS": "1"} if cpu else {})
    with log.open("w") as f:
        # Its own process group: a step over budget is ended with every process it started
        # (torchrun's ranks would otherwise keep the GPU's memory from the next step).
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_default_sigint,
        )
        try:
            code = proc.wait(timeout=budget)
            status = "ok" if code == 0 else f"failed: exit {code}"
        except subprocess.TimeoutExpired:
            # SIGINT first: pytest then writes its JUnit report of the tests done so far.
            _signal_group(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            status = f"failed: over its {budget:.0f} s budget"
        _signal_group(proc.pid, signal.SIGKILL)  # whatever of the step is left
        proc.wait()
    record |= {"status": status, "seconds": round(time.monotonic() - start, 1)}
    for name in ("result.json", "memory.json", "async_save.json"):
        path = out / name
        if path.exists():
            record["result"] = json.loads(path.read_text())
    if step.name == "pytest":
        record["result"] = junit_summary(out / "junit.xml")
    if status != "ok":
        record["log_tail"] = log.read_text(errors="replace").splitlines()[-30:]
    return record


def _default_sigint() -> None:
    """In the step's process: SIGINT raises KeyboardInterrupt again (a shell's background job
    inherits it ignored), so that the step can stop gracefully at its budget."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def junit_summary(path: Path) -> dict[str, Any]:
    """Passed / failed / skipped tests (with the skip reasons) from pytest's JUnit XML."""
    import xml.etree.ElementTree as ET

    if not path.exists():
        return {}
    cases: dict[str, list[str]] = {"passed": [], "failed": [], "skipped": []}
    reasons = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.get("name") is None:  # the test a SIGINT at the budget interrupted
            continue
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            cases["failed"].append(name)
        elif (skip := case.find("skipped")) is not None:
            cases["skipped"].append(name)
            reasons[name] = skip.get("message", "")
        else:
            cases["passed"].append(name)
    return cases | {"skip_reasons": reasons}


def headline(figures: dict[str, Any]) -> dict[str, Any]:
    """The ratios the GPU proof asks for, from the steps' results (None where a step did not run)."""

    def get(step: str, *keys: str) -> Any:
        value: Any = figures.get(step, {}).get("result")
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    ours = get("proxy", "bf16_mixed", "tokens_per_s")
    out: dict[str, Any] = {
        "proxy_tokens_per_s": ours,
        "proxy_tflops_per_gpu": get("proxy", "bf16_mixed", "tflops_per_gpu"),
        "proxy_mfu": get("proxy", "bf16_mixed", "mfu"),
    }
    for mode in ("eager", "compile"):
        theirs = get(f"torchtitan_{mode}", "tokens_per_s")
        out[f"torchtitan_{mode}_tokens_per_s"] = theirs
        out[f"ours_over_torchtitan_{mode}"] = ours / theirs if ours and theirs else None
    out["sdpa_share_of_step"] = get("attention", "sdpa_share_of_step")
    out["local_attention_share_of_step"] = get("attention", "local_share_of_step")
    memory = figures.get("memory", {}).get("result") or {}
    out["memory_predicted_over_measured"] = {
        name: r.get("ratio_to_allocated") for name, r in memory.items() if isinstance(r, dict)
    }
    fits = [f for f in get("calibrate") or [] if isinstance(f, dict) and "gpu" in f]
    if fits:  # the BF16 proxy at LAYERS: config/cost/steptime.py's prediction and the constants it implies
        out["model_predicted_over_measured"] = fits[0]["predicted_over_measured"]
        out["gemm_fit"] = {fits[0].get("gemm_constant"): fits[0].get("gemm_fit")}
        out["attention_fit"] = fits[0].get("attention_fit")
    out["proxy_fit_layers"] = get("proxy_fit", "bf16_mixed", "layers")
    out["proxy_fit_mfu"] = get("proxy_fit", "bf16_mixed", "mfu")
    out["async_save_overhead_s_per_save"] = get("async_save", "overhead_s_per_save")
    out["resume_exact"] = get("async_save", "resume_exact")
    return out


def summary(report: dict[str, Any]) -> str:
    lines = [f"# gpu-check {report['date']} on {report['device']}", ""]
    lines += [f"- {k}: {v}" for k, v in report["headline"].items()]
    lines += ["", "| step | status | seconds | command |", "|---|---|---|---|"]
    for name, r in report["steps"].items():
        lines.append(f"| {name} | {r.get('status')} | {r.get('seconds', '')} | `{r['command']}` |")
    if late := [n for n, r in report["steps"].items() if "deadline" in r.get("status", "")]:
        lines += ["", f'Not reached: GPU_CHECK_ARGS="--only {",".join(late)}" make gpu-check']
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--only", help="comma-separated step names: " + ",".join(s.name for s in STEPS)
    )
    parser.add_argument("--deadline-s", type=float, help="default 540 (GPU), 3600 (dry run)")
    parser.add_argument("--cpu-dry-run", action="store_true")
    parser.add_argument("--work", type=Path, help="the steps' folders (default: a temporary one)")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + (args.deadline_s or (3600.0 if args.cpu_dry_run else 540.0))
    wanted = set(args.only.split(",")) if args.only else {s.name for s in STEPS}
    unknown = wanted - {s.name for s in STEPS}
    if unknown:
        sys.exit(f"--only: unknown steps {sorted(unknown)}; known: {[s.name for s in STEPS]}")
    # Outside --out: $OUT sends back 8 files at most; the steps' files travel in logs.tar.gz.
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    args.out.mkdir(parents=True, exist_ok=True)
    figures: dict[str, Any] = {}
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for step in STEPS:
        if step.name not in wanted:
            continue
        figures[step.name] = run_step(step, args.cpu_dry_run, work, figures, deadline)
        print(f"gpu-check: {step.name}: {figures[step.name]['status']}", flush=True)
        report |= {"steps": figures, "headline": headline(figures)}
        env = figures.get("env", {}).get("result", {})
        report["device"] = "cpu (dry run)" if args.cpu_dry_run else env.get("device", "?")
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    (args.out / "summary.md").write_text(summary(report))
    with tarfile.open(args.out / "logs.tar.gz", "w:gz") as tar:
        tar.add(work, arcname="gpu_check", filter=small_files)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    print(summary(report))
    return 1 if any(r["status"].startswith("failed") for r in figures.values()) else 0


KEPT = (".txt", ".log", ".json", ".jsonl", ".yaml", ".xml", ".md")


def small_files(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Logs, configs and figures; no checkpoints or data shards (the tarball must come back)."""
    if "/checkpoints" in info.name or "/data_" in info.name:
        return None
    if info.isfile() and (not info.name.endswith(KEPT) or info.size > 4 * 2**20):
        return None
    return info


if __name__ == "__main__":
    sys.exit(main())
