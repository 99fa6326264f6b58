"""bench/data/published_perf.csv, NVIDIA's published pretraining throughputs, as runs the step-time
model can price: each row whose model has a preset here becomes a catalog recipe with the row's
layout, precision, batch and sequence as overrides, on the row's GPUs.

The table (one row per published figure, its source and commit in `source`) holds every public
NVIDIA figure a session could find: Megatron-Bridge's performance summaries 25.09-26.08 and their
archive, DGX Cloud benchmarking (dgxc-benchmarking v24.11-v25.05), NeMo's summaries 24.03-25.07,
Megatron-LM's A100 runs of 2021, and JSC's of 2023 (priced as each ran, apart from the split: `current`).
Columns printed wrong are read as run (bench/published_corrections.py). `newest()` keeps one row
per configuration (its newest release); `split()` divides them by a hash with a fixed seed into a
calibration part and a held-out part (a third): identical configurations fall on the same side,
so no held-out layout was seen in calibration, and rows added later move none across.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from bench.published_corrections import corrected
from bench.published_models import (
    ARCHITECTURES,
    RECIPES,
    loss_settings,
    megatron_lm_settings,
    notes_overrides,
)
from config.hardware import GPUS

if TYPE_CHECKING:
    from config.hardware import Cluster
    from config.schema import TrainingConfig

TABLE = Path(__file__).resolve().parent / "data" / "published_perf.csv"
SEED = 29  # the split's; never changed after the first fit
HELD_OUT = 1 / 3
BLACKWELL_SINCE = 25.09  # the first release whose Blackwell figures the model prices
CURRENT_SINCE = 24.0  # releases before: Megatron-LM's of 2021 and 2023 (`current`)

# system -> (GPU kind in config/hardware.py, GPUs per node, network GB/s per GPU: None, the GPU
# kind's). NVIDIA's DGX B300 runs cross nodes at a 400 Gb/s NIC's rate, not at the 800 Gb/s of
# the data sheet's ConnectX-8s: GPT-OSS 120B in BF16 at EP 64 over 8 nodes (half its step in
# alltoalls across nodes) ran 8,047 tokens/s/GPU on B200s and 8,359 on B300s (Megatron-Bridge
# 26.02), 4% more where twice the network would give 49%. 50 GB/s has the calibration part's
# least error of 25-100 (bench/plan_calibration.py --table); GB300s' racks keep their data sheet.
SYSTEMS: dict[str, tuple[str, int, float | None]] = {
    "A100": ("a100", 8, None),  # Selene's DGX A100 80 GB: an HDR NIC per GPU (25 GB/s)
    "JUWELS Booster": ("a100-40g", 4, None),  # JSC's: 4 A100 40 GB a node, a NIC each (SITES.md)
    "H100": ("h100", 8, None),
    "H200": ("h200", 8, None),
    "B200": ("b200", 8, None),
    "B300": ("b300", 8, 50.0),
    "GB200": ("gb200", 4, None),
    "GB300": ("gb300", 4, None),
}
PRECISIONS = {
    "bf16": "bf16_mixed",
    "fp16": "fp16_mixed",  # Megatron-LM 2021's; FP16 tensor cores run at the BF16 peak
    "fp8": "bf16_with_fp8_current_scaling_mixed",  # 26.x tables' "FP8" is current scaling
    "fp8_cs": "bf16_with_fp8_current_scaling_mixed",
    "fp8_ds": "bf16_with_fp8_delayed_scaling_mixed",
    "fp8_mx": "bf16_with_mxfp8_mixed",
    "fp8_sc": "bf16_with_fp8_subchannel_scaling_mixed",
    "nvfp4": "bf16_with_nvfp4_mixed",
}


@dataclass(frozen=True)
class TableRun:
    id: str
    model: str
    system: str
    gpus: int
    precision: str
    software: str
    source: str
    tokens_per_s_per_gpu: float
    release: float  # the software's YY.MM (Megatron-Bridge, NeMo; dgxc: its tag's), e.g. 26.04
    recipe: str
    gpu: str
    gpus_per_node: int
    # TP, PP, VPP (None: none), CP, EP and MBS, as the planner names them.
    layout: tuple[int, int, int | None, int, int, int]
    network_gb_s: float | None = None  # SYSTEMS': the network NVIDIA's runs show, else None
    overrides: list[str] = field(default_factory=list)
    # Those of `overrides` that the release's settings gave (MOE_SETTINGS, FUSED_SETTINGS,
    # RECOMPUTE_SETTINGS, OFFLOAD_SETTINGS, the loss and the layout): priced, but not part of the
    # configuration, so that learning them moved no run across the split.
    settings: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.id

    @property
    def config_key(self) -> tuple:
        """What makes two rows the same configuration (the split keeps them together)."""
        own = tuple(self.overrides[: len(self.overrides) - len(self.settings)])  # settings last
        return (self.model.replace("3.1", "3"), self.system, self.gpus,
                PRECISIONS[self.precision], self.layout, own)  # fmt: skip


# What Megatron-Bridge's performance recipes ran each MoE model with, by release, where the
# step-time model prices it: the token dispatcher (alltoall, or flex: DeepEP/HybridEP) and the
# alltoall overlap (overlap_moe_expert_parallel_comm). Read from the recipes at each release's
# tag in NVIDIA-NeMo/Megatron-Bridge: 25.09 = r0.1.0 684a686165, 25.11 = v0.2.0 7af9601c9d,
# 26.02 = v0.3.0 21b02e0cfb, 26.02.01 = v0.3.1 9c9dd84896, 26.04 = v0.4.0 0fbfe7d3e9,
# 26.04.01 = v0.4.2 c810129341, 26.06 = v0.5.0 fcbb603110, 26.06.01 = v0.5.1 5cb3444c43,
# 26.08 = v0.6.0 51885cf132 (scripts/performance/configs/<family>/*workload_base_configs.py and
# *_llm_pretrain.py, utils/overrides.py; from 26.08 src/megatron/bridge/perf_recipes/). The
# dispatcher as the code resolves it: before 26.02.01 apply_flex_dispatcher_backend takes HybridEP
# only on GB200/GB300, from 26.04 the workload config's backend field alone decides.
# bench/data/megatron_bridge_perf_settings.md tabulates these with the CUDA graphs, recompute and
# layouts of each release, model and GPU (what the model does not price yet: CUDA graphs).
# Where the container could not run what the recipe asked, the run took the default alltoall:
# "DeepEP is not supported in the current NeMo framework 26.02 container" (docs/releases/
# known-issues.md, 26.02, at v0.3.0 to 067f987df0), so 26.02's H100 Qwen3 30B-A3B recipe's DeepEP
# fell back (the figure, 5,113, sits with 25.11's alltoall run at 5,275, not 26.02.01's 9,058).
# (model, systems, precisions or "*", first release, last release, dispatcher, overlap)
MOE_SETTINGS: list[tuple[str, tuple[str, ...], str, float, float, str, bool]] = [
    ("Qwen3 235B-A22B", ("H100",), "*", 25.11, 99, "alltoall", True),
    ("Qwen3 235B-A22B", ("GB200", "GB300"), "fp8_mx", 26.06, 99, "flex", True),
    ("Qwen3 235B-A22B", ("GB200", "GB300"), "*", 25.11, 99, "flex", False),
    ("Qwen3 235B-A22B", ("B200",), "*", 25.11, 25.11, "alltoall", True),
    ("Qwen3 235B-A22B", ("B200", "B300"), "fp8_mx", 26.0601, 99, "flex", True),
    ("Qwen3 235B-A22B", ("B200",), "*", 26.02, 99, "alltoall", False),
    ("Qwen3 235B-A22B", ("B300",), "*", 26.02, 26.02, "alltoall", True),
    ("Qwen3 235B-A22B", ("B300",), "*", 26.0201, 26.04, "alltoall", False),
    ("Qwen3 235B-A22B", ("B300",), "*", 26.0401, 99, "flex", False),
    ("Qwen3 30B-A3B", ("H100",), "*", 25.11, 26.02, "alltoall", True),
    ("Qwen3 30B-A3B", ("H100",), "bf16", 26.08, 99, "flex", True),
    ("Qwen3 30B-A3B", ("H100",), "*", 26.0201, 99, "flex", False),
    ("Qwen3 30B-A3B", ("GB200", "GB300", "B300"), "fp8_mx", 26.06, 99, "flex", True),
    ("Qwen3 30B-A3B", ("B200",), "fp8_mx", 26.0601, 99, "flex", True),
    ("Qwen3 30B-A3B", ("GB200", "GB300", "B300"), "*", 25.11, 99, "flex", False),
    ("Qwen3 30B-A3B", ("B200",), "*", 26.0201, 99, "flex", False),
    ("Qwen3 30B-A3B", ("B200",), "*", 25.11, 26.02, "alltoall", False),
    ("GPT-OSS 120B", ("GB200", "GB300"), "fp8_mx", 26.06, 99, "flex", True),
    ("GPT-OSS 120B", ("GB200",), "*", 26.04, 99, "alltoall", True),
    ("GPT-OSS 120B", ("B300",), "*", 26.04, 99, "flex", False),
    ("GPT-OSS 120B", ("B200",), "*", 26.04, 26.0401, "flex", False),
    ("GPT-OSS 120B", ("H100", "B200", "B300", "GB200", "GB300"), "*", 25.11, 99, "alltoall", False),
    ("DeepSeek-V3", ("GB200", "GB300"), "fp8_mx", 26.06, 99, "flex", True),
    ("DeepSeek-V3", ("B300",), "fp8_mx", 26.0601, 99, "flex", True),
    ("DeepSeek-V3", ("B200",), "fp8_mx", 26.0401, 99, "flex", True),
    ("DeepSeek-V3", ("B200",), "*", 25.11, 25.11, "alltoall", False),
    ("DeepSeek-V3", ("H100",), "*", 25.11, 26.02, "flex", True),
    ("DeepSeek-V3", ("H100", "B200", "B300", "GB200", "GB300"), "*", 25.11, 99, "flex", False),
]


def _covers(rule: tuple, model: str, system: str, precision: str, release: float) -> bool:
    """Whether a (model, systems, precision or "*", first, last, ...) rule covers the run."""
    name, systems, prec, first, last = rule[:5]
    return (
        name == model
        and system in systems
        and prec in ("*", precision)
        and first <= release <= last
    )


def moe_settings(model: str, system: str, precision: str, release: float) -> list[str]:
    """The dispatcher and alltoall-overlap overrides of MOE_SETTINGS' first rule that covers the
    run ([] where none does: the row's notes, or the recipe's defaults)."""
    for rule in MOE_SETTINGS:
        if _covers(rule, model, system, precision, release):
            dispatcher, overlap = rule[5:]
            out = [f"model.moe_token_dispatcher_type={dispatcher}"]
            return out + [f"parallel.overlap_moe_expert_parallel_comm={str(overlap).lower()}"]
    return []


# CPU activation offloading in Megatron-Bridge's performance recipes (cpu_offloading_num_layers),
# each beside Megatron-FSDP without a pipeline: 25.09 from the YAML of r0.1.0 684a686165
# (scripts/performance/configs/llama3/llama3_70b_llm_pretrain.yaml, llama31/
# llama31_405b_llm_pretrain.yaml), 25.11 on from the workload base configs (7af9601c9d to
# 51885cf132, the same numbers in each; src/megatron/bridge/perf_recipes/llama/ at 067f987df0).
# Where an FSDP row's run offloaded, so does its price. (model, system, precisions, first
# release, last release, layers)
OFFLOAD_SETTINGS: list[tuple[str, str, tuple[str, ...], float, float, int]] = [
    ("Llama 3 70B", "GB200", ("bf16",), 25.09, 99, 20),
    ("Llama 3 70B", "GB200", ("fp8", "fp8_cs"), 25.09, 99, 40),
    ("Llama 3 70B", "GB300", ("bf16",), 25.11, 99, 30),
    ("Llama 3 70B", "GB300", ("fp8", "fp8_cs"), 25.11, 99, 20),
    ("Llama 3 70B", "B200", ("fp8", "fp8_cs"), 25.11, 99, 5),
    ("Llama 3.1 405B", "GB200", ("fp8", "fp8_cs"), 25.09, 25.09, 95),
    ("Llama 3.1 405B", "GB200", ("fp8", "fp8_cs"), 25.11, 99, 92),
    ("Llama 3.1 405B", "GB300", ("bf16",), 25.11, 99, 40),
    ("Llama 3.1 405B", "GB300", ("fp8", "fp8_cs"), 25.11, 99, 10),
]


def offload_settings(model: str, system: str, precision: str, release: float) -> list[str]:
    """The offloading override of the first OFFLOAD_SETTINGS rule that covers an FSDP run."""
    for name, gpu, precisions, first, last, n in OFFLOAD_SETTINGS:
        if (name, gpu) == (model, system) and precision in precisions and first <= release <= last:
            return [f"model.cpu_offloading_num_layers={n}"]
    return []


# Transformer Engine's fused grouped MLP of the experts (use_transformer_engine_op_fuser with
# NVTE_CUTEDSL_FUSED_GROUPED_MLP=1), part of the full-iteration CUDA-graph bundle Megatron-Bridge
# gives MXFP8 MoE runs on Blackwell from 26.06: scripts/performance/utils/overrides.py
# (cutedsl_fused_grouped_mlp) at v0.5.0 fcbb603110 and v0.5.1 5cb3444c43, the perf_recipes'
# _enable_hybridep_full_iteration_mxfp8 (qwen/common.py), _enable_deepseek_full_iteration_mxfp8
# and _apply_gpt_oss_120b_full_iter_fp8mx_configs at v0.6.0 51885cf132; tabulated as "FI" in
# bench/data/megatron_bridge_perf_settings.md. (model, systems, precision, first, last release)
FUSED_SETTINGS: list[tuple[str, tuple[str, ...], str, float, float]] = [
    ("Qwen3 235B-A22B", ("GB200", "GB300"), "fp8_mx", 26.06, 99),
    ("Qwen3 235B-A22B", ("B200", "B300"), "fp8_mx", 26.0601, 99),
    ("Qwen3 30B-A3B", ("GB200", "GB300", "B300"), "fp8_mx", 26.06, 99),
    ("Qwen3 30B-A3B", ("B200",), "fp8_mx", 26.0601, 99),
    ("GPT-OSS 120B", ("GB200", "GB300"), "fp8_mx", 26.06, 99),
    ("DeepSeek-V3", ("GB200", "GB300"), "fp8_mx", 26.06, 99),
    ("DeepSeek-V3", ("B300",), "fp8_mx", 26.0601, 99),
]


# Selective recompute in Megatron-Bridge's performance recipes where it differs from the recipe
# here (its recompute_modules; "" none): the workload base configs from v0.2.0 7af9601c9d to
# v0.5.1 5cb3444c43 (an empty list or no setting over a recipe that sets none: no recompute),
# the perf_recipes at v0.6.0 51885cf132; bench/data/megatron_bridge_perf_settings.md section 5.
# GPT-OSS 120B recomputes on H100, B200 and GB200 (but GB200's full-iteration MXFP8 from 26.06),
# never on GB300 or B300. (model, systems, precision or "*", first release, last release, modules)
RECOMPUTE_SETTINGS: list[tuple[str, tuple[str, ...], str, float, float, str]] = [
    ("GPT-OSS 120B", ("GB200",), "fp8_mx", 26.06, 99, ""),
    ("GPT-OSS 120B", ("GB300", "B300"), "*", 25.11, 99, ""),
    ("GPT-OSS 120B", ("H100", "B200", "GB200"), "*", 25.11, 99, "layernorm,moe_act"),
    ("DeepSeek-V3", ("GB300",), "*", 25.11, 25.11, "moe_act"),
    ("DeepSeek-V3", ("GB300",), "fp8_mx", 26.06, 99, ""),
    ("DeepSeek-V3", ("GB200",), "*", 26.04, 26.0401, "mlp"),
    ("DeepSeek-V3", ("B200",), "fp8_mx", 26.0401, 99, "mla_up_proj,mlp"),
    ("DeepSeek-V3", ("GB300", "GB200", "B300", "B200"), "*", 25.11, 99, "mla_up_proj"),
]


def recompute_settings(model: str, system: str, precision: str, release: float) -> list[str]:
    """The recompute overrides of the first RECOMPUTE_SETTINGS rule that covers the run."""
    for rule in RECOMPUTE_SETTINGS:
        if _covers(rule, model, system, precision, release):
            if not rule[5]:
                return ["model.recompute_granularity=None", "model.recompute_modules=None"]
            return ["model.recompute_granularity=selective", f"model.recompute_modules={rule[5]}"]
    return []


def mb2509_settings(model: str, system: str, release: float) -> list[str]:
    """What Megatron-Bridge 25.09 ran its MoE models with (r0.1.0 684a686165 scripts/performance/
    run_script.py): Qwen3 dropped tokens on every GPU, DeepSeek-V3 on B200 and GB200
    (apply_moe_token_drop: capacity 1.0, padded, on the alltoall dispatcher, DeepEP off), there
    with its shared experts beside the alltoall, and ran DeepEP overlapped (A2A_1F1B) on H100."""
    drop = ["model.moe_token_dispatcher_type=alltoall", "model.moe_expert_capacity_factor=1.0",
            "model.moe_pad_expert_input_to_capacity=true"]  # fmt: skip
    if release != 25.09 or not model.startswith(("Qwen3", "DeepSeek-V3")):
        return []
    if model.startswith("Qwen3"):
        return drop
    if system in ("B200", "GB200"):
        return [*drop, "parallel.overlap_moe_expert_parallel_comm=false",
                "model.moe_shared_expert_overlap=true"]  # fmt: skip
    return ["model.moe_token_dispatcher_type=flex",
            "parallel.overlap_moe_expert_parallel_comm=true"]  # fmt: skip


def fused_settings(model: str, system: str, precision: str, release: float) -> list[str]:
    """The fused grouped MLP where a FUSED_SETTINGS rule covers the run."""
    covered = any(_covers(rule, model, system, precision, release) for rule in FUSED_SETTINGS)
    return ["model.moe_fused_grouped_mlp=true"] if covered else []


# Megatron-Bridge's DeepSeek-V3 pipeline layouts by (PP, VPP): its recipe's map from 25.09
# (recipes/deepseek/deepseek_v3.py at r0.1.0 684a686165, `set_deepseek_v3_pipeline_model_parallel_
# layout` from v0.3.0 21b02e0cfb on), and its performance configs' `pp_layout` from 26.02
# (configs/deepseek/deepseek_workload_base_configs.py: GB300's PP 2 VPP 8, H100's PP 8 VPP 4).
# The MTP layer and the loss take the place of three decoder layers (two at 32 chunks).
DEEPSEEK_LAYOUTS: dict[tuple[int, int], tuple[float, str]] = {  # (PP, VPP): (since, layout)
    (4, 1): (25.09, "Et*16|t*16|t*16|t*13mL"),
    (8, 1): (25.09, "Et*8|(t*8|)*6t*5mL"),
    (4, 2): (25.09, "Et*8|(t*8|)*6t*5mL"),
    (16, 1): (25.09, "Et*4|(t*4|)*14tmL"),
    (8, 2): (25.09, "Et*4|(t*4|)*14tmL"),
    (4, 4): (25.09, "Et*4|(t*4|)*14tmL"),
    (2, 8): (26.02, "Et*4|(t*4|)*14tmL"),
    (8, 4): (26.02, "Et|(tt|)*30mL"),
}


def layout_settings(model: str, pp: int, vp: int | None, release: float) -> list[str]:
    """The pipeline layout a Megatron-Bridge DeepSeek-V3 run ran (DEEPSEEK_LAYOUTS), else nothing:
    the layout Megatron-Core derives, which the model prices otherwise."""
    since, layout = DEEPSEEK_LAYOUTS.get((pp, vp or 1), (float("inf"), ""))
    ok = model == "DeepSeek-V3" and release >= since
    return [f"parallel.pipeline_model_parallel_layout={layout}"] if ok else []


def _int(text: str, default: int | None = None) -> int | None:
    return int(float(text)) if text.strip() else default


def release(software: str) -> float:
    """YY.MM(.PP) of a software string as a number: "Megatron-Bridge 26.02.01 (...)" -> 26.0201."""
    yy, mm, patch = re.findall(r"(\d\d)\.(\d\d)(?:\.(\d\d))?", software)[-1]
    return int(yy) + int(mm) / 100 + int(patch or 0) / 10000


def priced(run: TableRun) -> tuple[TrainingConfig, Cluster]:
    """The run's configuration and the cluster it ran on, as the step-time model prices them:
    the row's GPUs in nodes of SYSTEMS' size, on the network NVIDIA's runs there show."""
    from launchers.jobsize import JobSize, job_cluster
    from recipes.registry import resolve

    recipe, cfg = resolve(run.recipe, run.overrides)
    size = JobSize(
        nodes=run.gpus // run.gpus_per_node, gpus_per_node=run.gpus_per_node, gpu=run.gpu
    )
    cluster = job_cluster(recipe.cluster, None, size)
    return cfg, dataclasses.replace(cluster, network_gb_s=run.network_gb_s or cluster.network_gb_s)


def why_refused(run: TableRun) -> str | None:
    """The checker's refusal of the run as the row gives it (e.g. an EP larger than a pipeline
    stage's ranks: a typo in the source, or a layout Megatron-Core cannot build), or None."""
    from config.rules import derive
    from config.tree import ConfigError

    try:
        derive(*priced(run))
    except ConfigError as err:
        return f"the checker refuses it: {str(err).splitlines()[0][:160]}"
    return None


def why_unpriced(row: dict[str, str]) -> str | None:
    if not row["tokens_per_s_per_gpu"].strip() or not row["mbs"].strip():
        return "no tokens/s or micro batch published"
    if row["model"] not in RECIPES:
        return (
            f"no preset of {row['model']} in models/presets, nor its architecture written out "
            "in ARCHITECTURES over a recipe of RECIPES"
        )
    if row["system"] not in SYSTEMS:
        return f"no GPU kind for {row['system']}"
    if "PROXY" in row["notes"]:
        return "a proxy with fewer layers than the model"
    if "STARTUP" in row["notes"]:
        return "a mean over too few iterations: the first ones' start-up weighs in it"
    if "REGRESSION" in row["notes"]:
        return "a figure its source gives as a known regression (a library's bug), since fixed"
    if row["precision"] not in PRECISIONS:
        return f"precision {row['precision']}"
    if GPUS[SYSTEMS[row["system"]][0]].mxfp8 and release(row["software"]) < BLACKWELL_SINCE:
        return (
            f"Blackwell software before {BLACKWELL_SINCE}: DeepSeek-V3 on 256 GB200s ran 958 "
            "tokens/s/GPU on NeMo 25.04 (dgxc v25.05.05), 3,454 on Megatron-Bridge 25.09"
        )
    return None


def load(path: Path = TABLE) -> tuple[list[TableRun], list[tuple[dict[str, str], str]]]:
    """(the priced runs, [(row, why not priced)])."""
    runs, skipped = [], []
    with path.open(newline="") as f:
        for row in map(corrected, csv.DictReader(f)):  # as run, where printed wrong
            why = why_unpriced(row)
            if why:
                skipped.append((row, why))
                continue
            gpu, per_node, network = SYSTEMS[row["system"]]
            gpus = int(row["gpus"])
            tp, pp, cp = _int(row["tp"], 1), _int(row["pp"], 1), _int(row["cp"], 1)
            vp, ep, mbs = _int(row["vp"]), _int(row["ep"], 1), _int(row["mbs"], 1)
            vp = vp if vp and vp > 1 else None
            overrides = [
                *ARCHITECTURES.get(row["model"], []),
                f"parallel.tensor_model_parallel_size={tp}",
                f"parallel.sequence_parallel={str(tp > 1).lower()}",
                f"parallel.pipeline_model_parallel_size={pp}",
                f"parallel.virtual_pipeline_model_parallel_size={vp}",
                f"parallel.context_parallel_size={cp}",
                f"parallel.expert_model_parallel_size={ep}",
                f"train.global_batch_size={_int(row['gbs'])}",
                f"train.micro_batch_size={mbs}",
                f"model.seq_length={_int(row['seq'])}",
                f"precision={PRECISIONS[row['precision']]}",
            ]
            if row["etp"].strip():
                overrides.append(f"parallel.expert_tensor_parallel_size={_int(row['etp'])}")
            if row["fsdp"].strip() == "1":
                overrides.append("parallel.use_megatron_fsdp=true")
            overrides += notes_overrides(row["notes"])
            settings = loss_settings(row["model"], row["software"])
            if row["software"].startswith("Megatron-LM"):  # its runs of 2021, JSC's of 2023
                settings += megatron_lm_settings(row["software"], row["notes"])
            if row["software"].startswith("Megatron-Bridge"):  # the release's own, last
                key = (row["model"], row["system"], row["precision"], release(row["software"]))
                settings += moe_settings(*key) + fused_settings(*key) + recompute_settings(*key)
                settings += offload_settings(*key) if row["fsdp"].strip() == "1" else []
                settings += mb2509_settings(row["model"], row["system"], key[-1])
                settings += layout_settings(row["model"], pp, vp, key[-1])
            if (
                row["model"] == "DeepSeek-V3"
                and row["software"].startswith("Megatron-Bridge")
                and "dispatcher=" not in row["notes"]
            ):
                # In the configuration the split hashes since it was drawn (SEED); what each
                # release ran comes after, in its settings (mb2509_settings, MOE_SETTINGS).
                overrides.append("model.moe_token_dispatcher_type=flex")
                if vp or pp == 1:
                    overrides.append("parallel.overlap_moe_expert_parallel_comm=true")
            run = TableRun(
                id=row["id"],
                model=row["model"],
                system=row["system"],
                gpus=gpus,
                precision=row["precision"],
                software=row["software"],
                source=row["source"],
                tokens_per_s_per_gpu=float(row["tokens_per_s_per_gpu"]),
                release=release(row["software"]),
                recipe=RECIPES[row["model"]],
                gpu=gpu,
                gpus_per_node=min(per_node, gpus),
                layout=(tp, pp, vp, cp, ep, mbs),
                network_gb_s=network,
                overrides=overrides + settings,
                settings=tuple(settings),
            )
            refused = why_refused(run)
            if refused:
                skipped.append((row, refused))
            else:
                runs.append(run)
    return runs, skipped


def is_current(r: TableRun) -> bool:
    """Whether the run is of Megatron-Core's releases (NeMo 24.03 on), which the split divides:
    Megatron-LM's A100 runs of 2021 and 2023 are older software, priced apart and never fitted on."""
    return r.release >= CURRENT_SINCE


def current(runs: list[TableRun]) -> list[TableRun]:
    """The `is_current` runs."""
    return [r for r in runs if is_current(r)]


def newest(runs: list[TableRun]) -> list[TableRun]:
    """One current run per configuration: the newest release's figure. The same layout on the same
    GPUs sped up as much as 4x across releases (Qwen3 30B-A3B on 8 GB200s, 25.09 to 26.06); the
    model prices today's software, so older figures of a layout stay in the table, unpriced."""
    best: dict[tuple, TableRun] = {}
    runs = current(runs)
    for r in runs:
        if r.config_key not in best or r.release > best[r.config_key].release:
            best[r.config_key] = r
    return [r for r in runs if best[r.config_key] is r]


@lru_cache(maxsize=1)
def _fitted() -> frozenset[tuple]:
    """tests/support/published_runs.py's configurations: (GPUs, layout, FP8)."""
    from tests.support.published_runs import RUNS

    return frozenset((f.gpus, f.layout, "fp8" in f.recipe + " ".join(f.overrides)) for f in RUNS)


def fitted_before(r: TableRun) -> bool:
    """Whether the configuration is one of tests/support/published_runs.py's (fitted before)."""
    return r.system == "H100" and (r.gpus, r.layout, r.precision != "bf16") in _fitted()


def split(runs: list[TableRun]) -> tuple[list[TableRun], list[TableRun]]:
    """(calibration, held out): whole configurations, held out where a hash of it and SEED falls
    in the first third (rows added later move no others); `fitted_before` ones calibration."""

    def held(r: TableRun) -> bool:
        digest = hashlib.sha256(f"{SEED} {r.config_key!r}".encode()).digest()
        return not fitted_before(r) and int.from_bytes(digest[:8], "big") / 2**64 < HELD_OUT

    return [r for r in runs if not held(r)], [r for r in runs if held(r)]
