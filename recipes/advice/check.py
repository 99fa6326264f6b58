"""`recipes check`: validate a resolved recipe on a cluster and predict whether it fits.

Exit codes (the CLI contract): 0 valid and predicted to fit, 2 invalid, 3 valid but predicted not to
fit in GPU memory. A config fits with the share of memory `recipes plan` keeps free too
(config/cost/memory.py `fits`, 8% unless --memory-margin says otherwise). When a config does not fit, the planner's fastest layouts that do are suggested;
a group that leaves its NVLink domain is warned about with the planner's fastest layout that keeps
it inside (suggest.py): `recipes plan` with the same overrides gives the same answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from config.cost.memory import (
    MEMORY_MARGIN,
    MemoryEstimate,
    estimate_memory,
    fits,
    fits_memory,
    host_limit_gib,
    limit_text,
    memory_limit_gib,
    model_flops_per_token,
)
from config.finalize import Partial, finalize
from config.hardware import Cluster
from config.rules import Problem, derive, validate
from config.rules.topology import topology
from config.schema import TrainingConfig, selective_modules
from recipes.advice.suggest import fixes, keep_inside

EXIT_OK, EXIT_INVALID, EXIT_NO_FIT = 0, 2, 3


@dataclass
class Report:
    cfg: TrainingConfig
    cluster: Cluster
    derived: Partial  # what the report shows, `?` where a value cannot be derived
    problems: list[Problem]
    memory: MemoryEstimate | None
    flops_per_token: float | None
    fixes: list[str] = field(default_factory=list)  # overrides predicted to make it fit
    # Valid but costly (config/rules/topology.py): the exit code does not change.
    warnings: list[Problem] = field(default_factory=list)
    margin: float = MEMORY_MARGIN  # the share of GPU memory a config must leave free

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def fits(self) -> bool:
        mem = self.memory
        return mem is not None and fits_memory(mem, self.cluster.spec, self.margin)

    @property
    def exit_code(self) -> int:
        if not self.valid:
            return EXIT_INVALID
        return EXIT_OK if self.fits else EXIT_NO_FIT

    def to_json(self) -> dict:
        mem = self.memory
        return {
            "recipe": self.cfg.name,
            "valid": self.valid,
            "fits": self.fits if self.valid else None,
            "errors": [{"field": p.field, "message": p.message} for p in self.problems],
            "world_size": self.derived.world_size,
            "data_parallel_size": self.derived.data_parallel_size,
            "num_microbatches": self.derived.num_microbatches,
            "pipeline_model_parallel_layout": self.derived.pipeline_layout,
            "gpu": self.cluster.gpu,
            "gpu_memory_gib": _finite(self.cluster.spec.memory_gib),
            "memory_limit_gib": _finite(
                memory_limit_gib(self.cluster.spec.memory_gib, self.margin)
            ),
            "memory_margin": self.margin,
            "memory_gib_per_gpu": round(mem.total_gib, 2) if mem else None,
            "memory_breakdown_gib": _breakdown(mem) if mem else None,
            "host_memory_gib_per_gpu": round(mem.host_gib, 2) if mem else None,
            "model_tflops_per_token": self.flops_per_token / 1e12 if self.flops_per_token else None,
            "fixes": self.fixes,
            "warnings": [{"field": w.field, "message": w.message} for w in self.warnings],
        }


def _si(value: float) -> str:
    """3 significant digits with a unit prefix: 0.261 T, 8.03 G, 1.11 M (a tiny model's figures
    would read 0.000 T and 0.00B)."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:.3g} {prefix}"
    return f"{value:.3g} "


def _count(value: float) -> str:
    """A parameter count as model cards write it: 8.03B, 1.11M, 558k."""
    return _si(value).replace(" G", "B").replace(" M", "M").replace(" k", "k").strip()


def _finite(value: float) -> float | None:
    return None if value == float("inf") else value


def _verdict(fit: bool) -> str:
    return "fits" if fit else "DOES NOT FIT"


MEMORY_PARTS = ("weights", "gradients", "optimizer", "activations", "logits", "step", "overhead")


def memory_parts(mem: MemoryEstimate) -> dict[str, float]:
    """The estimate's parts in GiB, by name (its total counts the larger of activations + logits
    and step): what `check --json` reports and bench/gpu_memory.py holds against a GPU."""
    return {part: getattr(mem, f"{part}_gib") for part in MEMORY_PARTS}


def _breakdown(mem: MemoryEstimate) -> dict[str, float]:
    return {part: round(gib, 2) for part, gib in memory_parts(mem).items()}


def check(
    cfg: TrainingConfig,
    cluster: Cluster,
    *,
    pinned: dict[str, object] | None = None,
    suggest_fixes: bool = True,
    margin: float = MEMORY_MARGIN,
) -> Report:
    """Validate `cfg` on `cluster` and estimate its memory; with `suggest_fixes`, the topology
    warnings and, when it does not fit (keeping `margin` of the memory free), the planner's layouts
    that do, within the `pinned` fields (recipes/advice/plan.py `pinned`: what the command line
    set, as `recipes plan` pins them)."""
    partial = finalize(cfg, cluster)
    problems = validate(cfg, cluster, partial)
    derived = None if problems else derive(cfg, cluster)
    memory = estimate_memory(cfg, cluster, derived) if derived else None
    flops = (
        model_flops_per_token(cfg)
        if not any(p.field.startswith("model.") for p in problems)
        else None
    )
    report = Report(cfg, cluster, partial, problems, memory, flops, margin=margin)
    if derived and suggest_fixes:
        warnings = topology(cfg, cluster, derived)
        report.warnings = [keep_inside(cfg, cluster, w, pinned, margin) for w in warnings]
    if report.valid and not report.fits and suggest_fixes:
        report.fixes = fixes(cfg, cluster, pinned, margin=margin)
    return report


def render(report: Report) -> str:
    """The short human-readable table that `recipes check` prints."""
    cfg, d, c = report.cfg, report.derived, report.cluster
    par = cfg.parallel
    lines = [
        f"recipe   {cfg.name}",
        f"cluster  {c.num_nodes} node(s) x {c.gpus_per_node} {c.gpu.upper()} = {d.world_size} GPUs",
        f"layout   TP {par.tensor_model_parallel_size}  PP {par.pipeline_model_parallel_size}"
        f"  VPP {par.virtual_pipeline_model_parallel_size or '-'}  CP {par.context_parallel_size}"
        f"  EP {par.expert_model_parallel_size}  DP {d.data_parallel_size or '?'}"
        f"  SP {'on' if par.sequence_parallel else 'off'}",
        f"batch    global {cfg.train.global_batch_size} = micro {cfg.train.micro_batch_size} x DP "
        f"{d.data_parallel_size or '?'} x {d.num_microbatches or '?'} microbatches, seq {cfg.model.seq_length}",
        f"precision {cfg.precision}",
    ]
    if d.pipeline_layout:
        lines.append(f"pipeline {d.pipeline_layout}")
    m = cfg.model
    if m.recompute_granularity == "full":
        lines.append(f"recompute full, {m.recompute_method}, {m.recompute_num_layers} layer(s)")
    elif m.recompute_granularity == "selective":
        lines.append(f"recompute selective: {','.join(selective_modules(m))}")
    if m.cpu_offloading_num_layers:
        lines.append(
            f"offload  the first {m.cpu_offloading_num_layers} layers' activations to host"
        )
    if m.moe_fused_grouped_mlp:
        lines.append("experts  FC1, activation and FC2 fused (Transformer Engine's CuTe DSL op)")
    if m.cross_entropy_fusion_impl == "te":
        lines.append(
            "loss     Transformer Engine's fused cross entropy (Megatron-LM refuses it for "
            "stability issues: NVIDIA/Megatron-LM#5115; model.cross_entropy_fusion_impl=native)"
        )
    if report.flops_per_token:
        lines.append(f"compute  {_si(report.flops_per_token)}FLOP per token (causal, fwd+bwd)")
    mem = report.memory
    if mem:
        lines.append("")
        lines.append(
            f"memory per GPU (pipeline rank {mem.pipeline_rank}, {_count(mem.params_per_gpu)} params)"
        )
        for part, gib in _breakdown(mem).items():
            if part != "step":
                lines.append(f"  {part:<12}{gib:>8.1f} GiB")
            elif gib > mem.activations_gib + mem.logits_gib:  # the peak is the optimizer step's
                lines.append(
                    f"  {'at step':<12}{gib:>8.1f} GiB: FP32 gradient copies at the optimizer "
                    "step, counted in place of activations and logits (the larger)"
                )
        on_gpu = fits(mem.total_gib, c.spec.memory_gib, report.margin)
        limit = (
            f" ({limit_text(c.spec.memory_gib, report.margin)})"
            if _finite(c.spec.memory_gib)
            else ""
        )
        lines.append(f"  {'total':<12}{mem.total_gib:>8.1f} GiB: {_verdict(on_gpu)}{limit}")
        if mem.host_gib:  # CPU activation offloading's pinned copies
            host, most = mem.host_gib, host_limit_gib(c.spec)
            lines.append(
                f"  {'host':<12}{host:>8.1f} GiB pinned: {_verdict(host <= most)} (at most "
                f"{most:.1f} of the node's {c.spec.host_memory_gib:.1f} GiB per GPU)"
            )
    if report.warnings:
        lines.append("")
        lines.append(f"{len(report.warnings)} warning(s), valid all the same:")
        lines += [f"  {w.field}: {w.message}" for w in report.warnings]
    if report.problems:
        lines.append("")
        lines.append(f"{len(report.problems)} problem(s):")
        lines += [f"  {p.field}: {p.message}" for p in report.problems]
    elif not report.fits:
        lines.append("")
        if report.fixes:
            lines.append("predicted to fit with:")
            lines += [f"  {fix}" for fix in report.fixes]
        else:
            lines.append(
                "no layout fits (`recipes plan`), not even on 64 times the nodes; use GPUs with "
                "more memory, or a smaller model, batch or sequence"
            )
    else:
        lines.append("")
        lines.append("valid")
    return "\n".join(lines)
