"""Peak GPU memory Megatron-LM measured on its own functional tests: an oracle for the memory
estimate (config/cost/memory.py) that nobody here wrote.

Source: NVIDIA/Megatron-LM at d98e8a64dd, tests/functional_tests/test_cases/<case>/: the run's
arguments (model_config.yaml MODEL_ARGS; here only those that size memory, the rest being logging,
paths, learning rates and checkpoint formats) and its golden values (golden_values_dev_dgx_<gpu>
.json). Megatron-LM's training loop logs `mem-max-allocated-bytes` (torch.cuda.memory_stats()
"allocated_bytes.all.peak") and `mem-allocated-bytes` (".current", after the optimizer step) on the
last rank, which writes TensorBoard (global_vars.py: rank world_size - 1): the last pipeline stage.
Each run has 8 GPUs (tests/test_utils/recipes/h100/gpt.yaml and moe.yaml: 1 node of 8; gb200/
gpt.yaml: 2 of 4); the largest value over the logged iterations is kept. Peak and at-rest values
are in bytes, per GPU kind. Each builds Transformer Engine's layers with a fused attention kernel
(--transformer-impl transformer_engine), as the engine does on GPUs; runs with Megatron-Core's
local layers, unfused attention, FSDP, offloading, CUDA graphs, Muon or FP16 are not taken.

The allocator's peak counts tensors only: not the CUDA context, NCCL's buffers or fragmentation,
which the estimate's OVERHEAD_GIB adds, but the cuBLAS and TE workspaces (a share of the same).

Not held here: moe/gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_optimizer (EP_ALLGATHER below),
whose allgather dispatcher over EP 8 peaks 0.6 GiB above the estimated tensors, about the gathered
tokens of each of its 12 layers (8 x 4096 x 512 x 2 bytes); the estimate prices that dispatcher's
activations as the alltoall one's. The runs above on it over EP 2 are held; the catalog's GPU
recipes run alltoall or flex (allgather only shrunk on the CPU, where no memory is judged).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from config.cost.memory import MemoryEstimate
    from config.hardware import Cluster
    from config.schema import TrainingConfig

GIB = 2**30
SOURCE = "NVIDIA/Megatron-LM@d98e8a64dd tests/functional_tests/test_cases"
# Megatron-LM's GPUs -> the kinds of config/hardware.py, and their nodes (GB200 trays hold 4).
KINDS = {"h100": ("h100", 8), "a100": ("a100", 8), "gb200": ("gb200", 4)}


@dataclass(frozen=True)
class MeasuredRun:
    case: str  # the test case's folder under SOURCE
    flags: str  # its MODEL_ARGS that size memory, as Megatron-LM's command line
    peak_bytes: dict[str, int]  # GPU kind -> mem-max-allocated-bytes
    rest_bytes: dict[str, int]  # GPU kind -> mem-allocated-bytes


RUNS = [
    MeasuredRun(
        "gpt/gpt3_7b_tp1_pp4_memory_speed",
        "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention "
        "--num-query-groups 8 --untie-embeddings-and-output-weights --micro-batch-size 1 "
        "--global-batch-size 8 --seq-length 8192 --vocab-size 131073 "
        "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 "
        "--num-layers-per-virtual-pipeline-stage 1 --use-distributed-optimizer",
        peak_bytes={"h100": 60720852992, "a100": 60489064448, "gb200": 60519342080},
        rest_bytes={"h100": 24808996864, "a100": 24511029248, "gb200": 24540168192},
    ),
    MeasuredRun(
        "gpt/gpt3_7b_tp4_pp1_memory_speed",
        "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --group-query-attention "
        "--num-query-groups 8 --untie-embeddings-and-output-weights --micro-batch-size 2 "
        "--global-batch-size 8 --seq-length 8192 --vocab-size 131073 "
        "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 1 "
        "--use-distributed-optimizer",
        peak_bytes={"h100": 57143791616, "a100": 58188115968, "gb200": 58217476096},
        rest_bytes={"h100": 20663519232, "a100": 20634103808, "gb200": 20663463936},
    ),
    MeasuredRun(
        "gpt/gpt3_mcore_te_tp1_pp1_resume_torch_dist_dist_optimizer",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --tensor-model-parallel-size 1 "
        "--pipeline-model-parallel-size 1 --use-distributed-optimizer",
        peak_bytes={"h100": 2691792384, "gb200": 2743026176},
        rest_bytes={"h100": 581489664, "gb200": 581489664},
    ),
    MeasuredRun(
        "gpt/gpt3_mcore_te_tp1_pp1_resume_torch_dist_uniform_full_recompute",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --tensor-model-parallel-size 1 "
        "--pipeline-model-parallel-size 1 --recompute-granularity full --recompute-method "
        "uniform --recompute-num-layers 1",
        peak_bytes={"h100": 2561334272, "gb200": 2562382848},
        rest_bytes={"h100": 1259751936, "gb200": 1259751936},
    ),
    MeasuredRun(
        "gpt/gpt3_mcore_te_tp1_pp2_resume_torch_dist_rope_embeddings",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --tensor-model-parallel-size 1 "
        "--pipeline-model-parallel-size 2 --position-embedding-type rope",
        peak_bytes={"h100": 2598238208, "gb200": 2623387648},
        rest_bytes={"h100": 919557120, "gb200": 923849728},
    ),
    MeasuredRun(
        "gpt/gpt3_mcore_te_tp1_pp4_resume_torch_dist_swiglu",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --tensor-model-parallel-size 1 "
        "--pipeline-model-parallel-size 4 --swiglu",
        peak_bytes={"h100": 2211485184, "gb200": 2235816960},
        rest_bytes={"h100": 745732608, "gb200": 762837504},
    ),
    MeasuredRun(
        "gpt/gpt3_mcore_te_tp1_pp4_resume_torch_dist_untie_embeddings_and_outputs",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --tensor-model-parallel-size 1 "
        "--pipeline-model-parallel-size 4 --untie-embeddings-and-output-weights",
        peak_bytes={"h100": 2210100224, "gb200": 2222684160},
        rest_bytes={"h100": 745395712, "gb200": 746444288},
    ),
    MeasuredRun(
        "gpt/gpt3_mcore_te_tp1_pp4_vp1_resume_torch_dist",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --tensor-model-parallel-size 1 "
        "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1",
        peak_bytes={"h100": 2643299328},
        rest_bytes={"h100": 763220480},
    ),
    MeasuredRun(
        "gpt/gpt3_mcore_te_tp1_pp4_vp1_resume_torch_dist_dist_optimizer_overlap_grad_reduce",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --tensor-model-parallel-size 1 "
        "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 1 "
        "--use-distributed-optimizer",
        peak_bytes={"h100": 2432144384, "gb200": 2480714752},
        rest_bytes={"h100": 552065536, "gb200": 567196160},
    ),
    MeasuredRun(
        "gpt/gpt3_mcore_te_tp2_pp1_resume_torch_dist_cp2_nondeterministic",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --tensor-model-parallel-size 2 "
        "--pipeline-model-parallel-size 1 --context-parallel-size 2 --sequence-parallel "
        "--hidden-dropout 0.0 --attention-dropout 0.0 --attention-backend flash",
        peak_bytes={"h100": 1233807360, "gb200": 1230661120},
        rest_bytes={"h100": 691715584, "gb200": 690404864},
    ),
    MeasuredRun(
        "gpt/gpt3_mcore_te_tp2_pp2_cp2",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --vocab-size 50257 "
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
        "--context-parallel-size 2 --sequence-parallel --hidden-dropout 0.0 "
        "--attention-dropout 0.0 --attention-backend flash",
        peak_bytes={"h100": 935253504, "gb200": 938399232},
        rest_bytes={"h100": 510689792, "gb200": 510689792},
    ),
    MeasuredRun(
        "gpt/gpt3_mcore_te_tp2_pp2_resume_torch_dist",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --tensor-model-parallel-size 2 "
        "--pipeline-model-parallel-size 2",
        peak_bytes={"h100": 1428171264, "gb200": 1439181312},
        rest_bytes={"h100": 517243392, "gb200": 514884096},
    ),
    MeasuredRun(
        "gpt/gpt3_mcore_te_tp2_pp2_cross_entropy_loss_fusion",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --tensor-model-parallel-size 2 "
        "--pipeline-model-parallel-size 2 --cross-entropy-loss-fusion",
        peak_bytes={"h100": 1837640192, "gb200": 1838393856},
        rest_bytes={"h100": 514359808, "gb200": 514359808},
    ),
    MeasuredRun(
        "gpt/gpt3_mcore_te_tp4_pp1_resume_torch_dist_dist_optimizer_overlap_grad_reduce",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --tensor-model-parallel-size 4 "
        "--pipeline-model-parallel-size 1 --use-distributed-optimizer",
        peak_bytes={"h100": 1042465280, "gb200": 1059371008},
        rest_bytes={"h100": 299204096, "gb200": 299204096},
    ),
    MeasuredRun(
        "gpt/gpt3_mcore_te_tp4_pp1_resume_torch_dist_qk_layernorm_test_mode",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --tensor-model-parallel-size 4 "
        "--pipeline-model-parallel-size 1 --qk-layernorm",
        peak_bytes={"h100": 1177314304, "gb200": 1185178624},
        rest_bytes={"h100": 398273024, "gb200": 397748736},
    ),
    MeasuredRun(
        "gpt/gpt3_mcore_te_tp4_pp2_resume_torch_dist_reshard_8x1xNone",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --tensor-model-parallel-size 4 "
        "--pipeline-model-parallel-size 2 --use-distributed-optimizer",
        peak_bytes={"h100": 844288512, "gb200": 793956864},
        rest_bytes={"h100": 311828992, "gb200": 261759488},
    ),
    MeasuredRun(
        "moe/gpt3_mcore_cp2_pp2_ep2_te_4experts2parallel_nondeterministic",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --context-parallel-size 2 "
        "--pipeline-model-parallel-size 2 --expert-model-parallel-size 2 --sequence-parallel "
        "--hidden-dropout 0.0 --attention-dropout 0.0 --num-experts 4 "
        "--moe-router-load-balancing-type sinkhorn --moe-router-topk 1 --attention-backend "
        "flash --disable-bias-linear",
        peak_bytes={"h100": 2061327360, "gb200": 2058651648},
        rest_bytes={"h100": 1156796416, "gb200": 1155676160},
    ),
    MeasuredRun(
        "moe/gpt3_mcore_te_tp1_pp2_resume_torch_dist_reshard_2x1x4_te_8experts2parallel_dist_optimizer",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --tensor-model-parallel-size 1 "
        "--pipeline-model-parallel-size 2 --expert-model-parallel-size 2 --sequence-parallel "
        "--num-experts 8 --use-distributed-optimizer --moe-router-load-balancing-type "
        "sinkhorn --moe-router-topk 1 --disable-bias-linear",
        peak_bytes={"h100": 2834290176, "gb200": 2829482496},
        rest_bytes={"h100": 1016926720, "gb200": 1014760960},
    ),
    MeasuredRun(
        "moe/gpt3_mcore_te_tp2_pp1_resume_torch_dist_te_8experts2parallel_dist_optimizer",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --tensor-model-parallel-size 2 "
        "--pipeline-model-parallel-size 1 --expert-model-parallel-size 2 --sequence-parallel "
        "--num-experts 8 --use-distributed-optimizer --moe-router-load-balancing-type "
        "sinkhorn --moe-router-topk 1 --disable-bias-linear",
        peak_bytes={"h100": 2159231488, "gb200": 2191795712},
        rest_bytes={"h100": 892871680, "gb200": 892875264},
    ),
    MeasuredRun(
        "moe/gpt3_mcore_te_tp2_pp1_frozen_resume_torch_dist_te_8experts2parallel_groupedGEMM",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --tensor-model-parallel-size 2 "
        "--pipeline-model-parallel-size 1 --expert-model-parallel-size 2 --moe-grouped-gemm "
        "--disable-bias-linear --sequence-parallel --num-experts 8 "
        "--moe-router-load-balancing-type sinkhorn --moe-router-topk 1",
        peak_bytes={"h100": 2728780800},
        rest_bytes={"h100": 1509930496},
    ),
    MeasuredRun(
        "moe/gpt3_mcore_tp2_cp2_pp2_ep2_te_4experts2parallel",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --tensor-model-parallel-size 2 "
        "--pipeline-model-parallel-size 2 --context-parallel-size 2 "
        "--expert-model-parallel-size 2 --sequence-parallel --num-experts 4 "
        "--moe-router-load-balancing-type sinkhorn --moe-router-topk 1 --attention-backend "
        "flash --disable-bias-linear",
        peak_bytes={"h100": 1114966528, "gb200": 1114732032},
        rest_bytes={"h100": 628506624, "gb200": 627720704},
    ),
    MeasuredRun(
        "moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_resume_torch_dist_dist_optimizer",
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
        "--global-batch-size 32 --seq-length 1024 --disable-bias-linear "
        "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 "
        "--expert-model-parallel-size 2 --expert-tensor-parallel-size 2 --sequence-parallel "
        "--num-experts 8 --use-distributed-optimizer --moe-token-dispatcher-type alltoall "
        "--moe-router-load-balancing-type aux_loss --moe-router-topk 2 --moe-ffn-hidden-size "
        "1024 --moe-shared-expert-intermediate-size 512 --moe-grouped-gemm",
        peak_bytes={"h100": 1149626368, "gb200": 1155870208},
        rest_bytes={"h100": 628064768, "gb200": 628064768},
    ),
]

EP_ALLGATHER = MeasuredRun(
    "moe/gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_optimizer",
    "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --micro-batch-size 4 "
    "--global-batch-size 32 --seq-length 1024 --disable-bias-linear "
    "--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 "
    "--expert-model-parallel-size 8 --num-experts 8 --use-distributed-optimizer "
    "--moe-token-dispatcher-type allgather --moe-router-load-balancing-type aux_loss "
    "--moe-router-topk 2 --moe-ffn-hidden-size 1024 --moe-grouped-gemm",
    peak_bytes={"h100": 3359425024},
    rest_bytes={"h100": 788620288},
)


def args(run: MeasuredRun) -> dict[str, Any]:
    """The run's flags as Megatron-LM parses them: a flag without a value is True."""
    out: dict[str, Any] = {}
    words = run.flags.split()
    for i, word in enumerate(words):
        if word.startswith("--"):
            value = (
                words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else True
            )
            out[word] = _number(value) if isinstance(value, str) else value
    return out


def _number(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


# The flags `overrides` and `fused_loss` read; --attention-backend only as "flash" (the fused
# attention the estimate prices: no score matrix).
FLAGS = frozenset(
    """--attention-backend --attention-dropout --context-parallel-size --cross-entropy-loss-fusion
    --disable-bias-linear --expert-model-parallel-size --expert-tensor-parallel-size
    --ffn-hidden-size --global-batch-size --group-query-attention --hidden-dropout --hidden-size
    --kv-channels --micro-batch-size --moe-aux-loss-coeff --moe-ffn-hidden-size --moe-grouped-gemm
    --moe-router-load-balancing-type --moe-router-topk --moe-shared-expert-intermediate-size
    --moe-token-dispatcher-type --normalization --num-attention-heads --num-experts --num-layers
    --num-layers-per-virtual-pipeline-stage --num-query-groups
    --num-virtual-stages-per-pipeline-rank --pipeline-model-parallel-size
    --position-embedding-type --qk-layernorm --recompute-granularity --recompute-method
    --recompute-num-layers --seq-length --sequence-parallel --swiglu --tensor-model-parallel-size
    --untie-embeddings-and-output-weights --use-distributed-optimizer --vocab-size""".split()
)


def overrides(run: MeasuredRun) -> list[str]:
    """The run as `key=value` overrides of a catalog recipe: Megatron-LM's defaults where an
    argument is absent (LayerNorm, GELU MLP of 4 h, learned positions, biases, tied embeddings,
    dropout 0.1, the allgather dispatcher, an auxiliary loss coefficient of 0, FP32 gradient
    accumulation with BF16), GPT-2's vocabulary (50,257: the tests read its vocab.json) without
    --vocab-size, and sequence parallelism off at TP 1 (Megatron-LM turns it off there)."""
    a = args(run)
    unread = sorted(set(a) - FLAGS) + (
        ["--attention-backend"] if a.get("--attention-backend", "flash") != "flash" else []
    )
    if unread:
        raise ValueError(f"{run.case}: flags the translation does not read: {unread}")
    h, heads, layers = a["--hidden-size"], a["--num-attention-heads"], a["--num-layers"]
    tp, pp = a.get("--tensor-model-parallel-size", 1), a.get("--pipeline-model-parallel-size", 1)
    swiglu = bool(a.get("--swiglu"))
    ffn = a.get("--ffn-hidden-size") or (int(4 * h * 2 / 3 / 64) * 64 if swiglu else 4 * h)
    vp = a.get("--num-virtual-stages-per-pipeline-rank")
    if a.get("--num-layers-per-virtual-pipeline-stage"):
        vp = layers // pp // a["--num-layers-per-virtual-pipeline-stage"]
    groups = a["--num-query-groups"] if a.get("--group-query-attention") else "null"
    out = {
        "model.num_layers": layers,
        "model.hidden_size": h,
        "model.ffn_hidden_size": ffn,
        "model.num_attention_heads": heads,
        "model.num_query_groups": groups,
        "model.kv_channels": a.get("--kv-channels") or h // heads,
        "model.activation": "swiglu" if swiglu else "gelu",
        "model.normalization": a.get("--normalization", "LayerNorm"),
        "model.position_embedding_type": a.get("--position-embedding-type", "learned_absolute"),
        "model.share_embeddings_and_output_weights": not a.get(
            "--untie-embeddings-and-output-weights"
        ),
        "model.add_bias_linear": not a.get("--disable-bias-linear"),
        "model.qk_layernorm": bool(a.get("--qk-layernorm")),
        "model.hidden_dropout": a.get("--hidden-dropout", 0.1),
        "model.attention_dropout": a.get("--attention-dropout", 0.1),
        "model.vocab_size": a.get("--vocab-size") or 50257,  # GPT-2's vocab.json
        "model.seq_length": a["--seq-length"],
        "model.recompute_granularity": a.get("--recompute-granularity"),
        "train.micro_batch_size": a["--micro-batch-size"],
        "train.global_batch_size": a["--global-batch-size"],
        "parallel.tensor_model_parallel_size": tp,
        "parallel.pipeline_model_parallel_size": pp,
        "parallel.virtual_pipeline_model_parallel_size": vp if vp and vp > 1 else None,
        "parallel.context_parallel_size": a.get("--context-parallel-size", 1),
        "parallel.sequence_parallel": bool(a.get("--sequence-parallel")) and tp > 1,
        "parallel.expert_model_parallel_size": a.get("--expert-model-parallel-size", 1),
        "parallel.expert_tensor_parallel_size": a.get("--expert-tensor-parallel-size"),
        "parallel.grad_reduce_in_fp32": True,
        "optimizer.use_distributed_optimizer": bool(a.get("--use-distributed-optimizer")),
        "precision": "bf16_mixed",
    }
    if a.get("--recompute-granularity") == "full":
        out["model.recompute_method"] = a.get("--recompute-method", "uniform")
        out["model.recompute_num_layers"] = a.get("--recompute-num-layers", 1)
    if a.get("--num-experts"):
        out |= {
            "model.num_moe_experts": a["--num-experts"],
            "model.moe_router_topk": a.get("--moe-router-topk", 2),
            "model.moe_ffn_hidden_size": a.get("--moe-ffn-hidden-size") or ffn,
            "model.moe_shared_expert_intermediate_size": a.get(
                "--moe-shared-expert-intermediate-size"
            ),
            "model.moe_grouped_gemm": bool(a.get("--moe-grouped-gemm")),
            "model.moe_token_dispatcher_type": a.get("--moe-token-dispatcher-type", "allgather"),
            "model.moe_router_load_balancing_type": a.get(
                "--moe-router-load-balancing-type", "aux_loss"
            ),
            "model.moe_aux_loss_coeff": a.get("--moe-aux-loss-coeff", 0.0),
        }
    return [f"{k}={_text(v)}" for k, v in out.items()]


def _text(value: Any) -> str:
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def fused_loss(run: MeasuredRun) -> bool:
    """Whether the run's loss is Megatron-Core's fused cross entropy, as the engine runs it on
    GPUs (models/gpt.py); without --cross-entropy-loss-fusion Megatron-LM runs the unfused one."""
    return "--cross-entropy-loss-fusion" in run.flags.split()


def short(case: str) -> str:
    return re.sub(r"^(gpt|moe)/(gpt3_)?", "", case)


def configured(run: MeasuredRun, kind: str) -> tuple[TrainingConfig, Cluster]:
    """The run as a config of a catalog recipe, on the cluster it ran on: 8 GPUs of `kind`."""
    from launchers.jobsize import JobSize, job_cluster
    from recipes.registry import resolve

    recipe, cfg = resolve("llama3_8b_pretrain", overrides(run))
    gpu, per_node = KINDS[kind]
    size = JobSize(nodes=8 // per_node, gpus_per_node=per_node, gpu=gpu)
    return cfg, job_cluster(recipe.cluster, None, size)


def estimated(run: MeasuredRun, kind: str) -> tuple[MemoryEstimate, float]:
    """The estimate for the run's last pipeline rank, where Megatron-LM measured, on 8 GPUs of
    `kind`, and the tensors of it the allocator counts, in GiB: all but OVERHEAD_GIB, with the
    loss the run had (`logit_bytes` prices the engine's fused one; Megatron-LM's unfused loss
    holds 6 bytes a logit)."""
    from config.cost.memory import estimate_memory, logit_bytes
    from config.rules import derive

    cfg, cluster = configured(run, kind)
    last = cfg.parallel.pipeline_model_parallel_size - 1
    mem = estimate_memory(cfg, cluster, derive(cfg, cluster), on_rank=last)
    logits = mem.logits_gib * (1 if fused_loss(run) else 6 / logit_bytes(cfg, cluster))
    return mem, mem.total_gib - mem.overhead_gib - mem.logits_gib + logits
