"""The checker's MoE rules held against Megatron-Core 0.19.2's own code.

A seeded sample of near-valid MoE configs (a valid base with one to three fields moved around a
rule: TP, SP, EP, ETP, the FFN widths, top-k, pre-softmax, score function, load balancing, the
dispatcher and its alltoall overlap, biases, group-limited routing, dense layers) goes through `config.rules.validate` and
through Megatron-Core:

- `TransformerConfig(...)` as the engine builds it (`models.gpt.transformer_config`, on the CPU;
  it needs no process group), then Megatron-Core's decoder layer specs for it;
- the model itself: Megatron-Core's parallel state and every pipeline stage's chunks, built on
  torch's fake process group and the meta device (tests/support/megatron_build.py), with
  Megatron-Core's local layers (Transformer Engine's are not installed here; a module that needs
  DeepEP or HybridEP is left to the emulation below);
- the rules Megatron-Core applies on other ranks or in the first training step, emulated from its
  source and named below (`_first_step`). The divisibility ones call Megatron-Core's own `divide`,
  as its parallel linear layers do; the router's runs Megatron-Core's own top-k routing.

The test asserts the same verdict (valid or not) from both, config by config.
"""

from __future__ import annotations

import copy
import random
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_layer_specs  # noqa: E402
from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function  # noqa: E402
from megatron.core.utils import divide  # noqa: E402

from config.finalize import Partial, finalize  # noqa: E402
from config.hardware import Cluster  # noqa: E402
from config.precision import TORCH_DTYPES  # noqa: E402
from config.rules import validate  # noqa: E402
from config.schema import ModelConfig, ParallelConfig, TrainConfig, TrainingConfig  # noqa: E402
from models.gpt import transformer_config  # noqa: E402
from tests.support import megatron_build  # noqa: E402

H100x8 = Cluster(num_nodes=1, gpus_per_node=8, gpu="h100")
SAMPLES = 300

# Rules where the checker is stricter than Megatron-Core on purpose. (A config that only
# Megatron-Core accepts would fail the test; list the rule here, with why, and how the oracle
# counts it.)
STRICTER: dict[str, str] = {
    "group_limited_masked": "group-limited routing whose chosen groups hold fewer than top-k "
    "experts (moe_router_topk > group_topk x experts per group): Megatron-Core runs it, routing "
    "the rest to experts of masked-out groups with NaN (sigmoid, pre-softmax) or zero weights; "
    "`_first_step` counts a routing with such weights as refused",
    "moe_all_dense": "model.moe_first_k_dense_layers = model.num_layers: Megatron-Core builds "
    "every layer dense and ignores the MoE fields (its MoE layers' own asserts never run); "
    "`_first_step` counts such a model as refused",
}


def base() -> TrainingConfig:
    """A small MoE model on 8 H100s (TP 2 with SP, EP 4) that both sides accept."""
    return TrainingConfig(
        name="moe_oracle",
        model=ModelConfig(
            num_layers=4,
            hidden_size=256,
            ffn_hidden_size=1024,
            num_attention_heads=8,
            num_query_groups=4,
            seq_length=512,
            vocab_size=1024,
            num_moe_experts=8,
            moe_router_topk=2,
            moe_ffn_hidden_size=512,
        ),
        train=TrainConfig(global_batch_size=32, max_steps=10_000),
        parallel=ParallelConfig(
            tensor_model_parallel_size=2, sequence_parallel=True, expert_model_parallel_size=4
        ),
    )


# field -> values to try around each rule
MOVES: dict[str, list] = {
    "parallel.tensor_model_parallel_size": [1, 2, 4],
    "parallel.sequence_parallel": [True, False],
    "parallel.expert_model_parallel_size": [1, 2, 4, 8],
    "parallel.expert_tensor_parallel_size": [None, 1, 2, 4],
    "model.ffn_hidden_size": [1024, 1022, 1026, 1030],
    "model.moe_ffn_hidden_size": [None, 512, 510, 513, 514],
    "model.moe_shared_expert_intermediate_size": [None, 512, 514, 513],
    "model.moe_first_k_dense_layers": [0, 0, 1, 4, 5],
    "model.moe_router_topk": [1, 2, 8, 9],
    "model.moe_router_pre_softmax": [True, False],
    "model.moe_router_score_function": ["softmax", "sigmoid"],
    "model.moe_router_load_balancing_type": ["aux_loss", "sinkhorn", "none"],
    "model.moe_aux_loss_coeff": [0.0, 1e-2],
    "model.moe_token_dispatcher_type": ["alltoall", "allgather", "flex"],
    "model.moe_flex_dispatcher_backend": ["deepep", "hybridep"],
    "model.add_bias_linear": [False, True],
    "model.moe_router_enable_expert_bias": [False, True],
    "model.moe_router_num_groups": [None, 2, 3, 4],
    "model.moe_router_group_topk": [None, 1, 2, 5],
    "model.mtp_num_layers": [None, 1],
    "parallel.overlap_moe_expert_parallel_comm": [False, True],
    "model.moe_shared_expert_overlap": [False, True],
    "model.moe_expert_capacity_factor": [None, None, 1.0, 1.5],
    "model.moe_pad_expert_input_to_capacity": [False, False, True],
}


def _set(cfg: TrainingConfig, path: str, value: object) -> None:
    if "." not in path:
        setattr(cfg, path, value)
        return
    section, name = path.split(".")
    setattr(getattr(cfg, section), name, value)


A2A = "parallel.overlap_moe_expert_parallel_comm"
PP2 = ("parallel.pipeline_model_parallel_size", 2)
EP2 = ("parallel.expert_model_parallel_size", 2)


# Corners that random moves reach rarely: each rule's edge, on one side and the other.
CASES: list[list[tuple[str, object]]] = [
    # the flex dispatcher over one rank, and over two
    [
        ("parallel.tensor_model_parallel_size", 1),
        ("parallel.sequence_parallel", False),
        ("parallel.expert_model_parallel_size", 1),
        ("model.moe_token_dispatcher_type", "flex"),
    ],
    [
        ("parallel.tensor_model_parallel_size", 1),
        ("parallel.sequence_parallel", False),
        ("parallel.expert_model_parallel_size", 2),
        ("model.moe_token_dispatcher_type", "flex"),
    ],
    [("parallel.expert_model_parallel_size", 1), ("parallel.expert_tensor_parallel_size", 1)]
    + [("model.moe_token_dispatcher_type", "flex")],
    # ... with HybridEP, which has no such assert
    [("parallel.expert_model_parallel_size", 1), ("parallel.expert_tensor_parallel_size", 1)]
    + [
        ("model.moe_token_dispatcher_type", "flex"),
        ("model.moe_flex_dispatcher_backend", "hybridep"),
    ],
    # a dense FFN width that TP does not divide, used by no layer, by a dense first layer
    [("parallel.tensor_model_parallel_size", 4), ("model.ffn_hidden_size", 1026)],
    [
        ("parallel.tensor_model_parallel_size", 4),
        ("model.ffn_hidden_size", 1026),
        ("model.moe_first_k_dense_layers", 1),
    ],
    # ... and as the experts' width (moe_ffn_hidden_size unset), split over ETP 1 or TP
    [("model.ffn_hidden_size", 1026), ("model.moe_ffn_hidden_size", None)],
    [
        ("parallel.tensor_model_parallel_size", 4),
        ("model.ffn_hidden_size", 1026),
        ("model.moe_ffn_hidden_size", None),
        ("parallel.expert_tensor_parallel_size", 1),
        ("parallel.expert_model_parallel_size", 8),
    ],
    # token dropping: padded without a capacity, with sinkhorn, padded under each flex backend
    [("model.moe_pad_expert_input_to_capacity", True)],
    [("model.moe_expert_capacity_factor", 1.0), ("model.moe_pad_expert_input_to_capacity", True)],
    [
        ("model.moe_expert_capacity_factor", 1.0),
        ("model.moe_router_load_balancing_type", "sinkhorn"),
    ]
    + [("model.moe_aux_loss_coeff", 0.0)],
    *(
        [
            ("model.moe_expert_capacity_factor", 1.0),
            ("model.moe_pad_expert_input_to_capacity", True),
        ]
        + [("model.moe_token_dispatcher_type", "flex"), ("model.moe_flex_dispatcher_backend", b)]
        for b in ("deepep", "hybridep")
    ),
    # top-1 softmax routing: without pre-softmax, with it, with sinkhorn (no aux loss)
    [("model.moe_router_topk", 1)],
    [("model.moe_router_topk", 1), ("model.moe_router_pre_softmax", True)],
    [("model.moe_router_topk", 1), ("model.moe_router_load_balancing_type", "sinkhorn")]
    + [("model.moe_aux_loss_coeff", 0.0)],
    # MoE with TP and no SP; with TP 1 and no SP
    [("parallel.sequence_parallel", False)],
    [("parallel.tensor_model_parallel_size", 1), ("parallel.sequence_parallel", False)],
    # selective recompute of the experts' activation (grouped GEMMs or not), shared experts
    [("model.recompute_granularity", "selective"), ("model.recompute_modules", "moe_act")]
    + [("model.moe_grouped_gemm", True)],
    [
        ("model.recompute_granularity", "selective"),
        ("model.recompute_modules", "moe_act,layernorm"),
        ("model.moe_grouped_gemm", False),
    ],
    [("model.recompute_granularity", "selective"), ("model.recompute_modules", "shared_experts")]
    + [("model.moe_shared_expert_intermediate_size", 512)],
    [("model.recompute_granularity", "selective"), ("model.recompute_modules", "moe,mlp")],
    # the alltoall overlap (combined 1F1B) around each of its conditions
    *(
        [(A2A, True), *moves]
        for moves in (
            [],
            [("parallel.expert_model_parallel_size", 1)],
            [("model.moe_token_dispatcher_type", "allgather")],
            [("model.moe_token_dispatcher_type", "flex")],
            [PP2, EP2],
            [PP2, EP2, ("parallel.virtual_pipeline_model_parallel_size", 2)],
            [PP2, EP2, ("parallel.pipeline_model_parallel_layout", "Et|t|t|tL")],
            [PP2, EP2, ("parallel.pipeline_model_parallel_layout", "Ett|ttL")],
            [("model.recompute_granularity", "full"), ("model.recompute_method", "uniform")]
            + [("model.recompute_num_layers", 1)],
            [("model.recompute_granularity", "selective"), ("model.recompute_modules", "moe")],
            [("model.recompute_granularity", "selective")]
            + [("model.recompute_modules", "moe_act,layernorm"), ("model.moe_grouped_gemm", True)],
            [("precision", "fp32")],
            [("precision", "fp16_mixed")],
            [("model.mtp_num_layers", 2)],
        )
    ),
    # the shared experts behind the exchange: with each dispatcher, with them recomputed, with
    # no shared experts (ignored), with the alltoall overlap
    *(
        [("model.moe_shared_expert_overlap", True), *moves]
        for moves in (
            [("model.moe_shared_expert_intermediate_size", 512)],
            [("model.moe_shared_expert_intermediate_size", 512)]
            + [("model.moe_token_dispatcher_type", "allgather")],
            [("model.moe_shared_expert_intermediate_size", 512)]
            + [("model.moe_token_dispatcher_type", "flex")],
            [("model.moe_shared_expert_intermediate_size", 512)]
            + [("model.recompute_granularity", "selective")]
            + [("model.recompute_modules", "shared_experts")],
            [("model.moe_shared_expert_intermediate_size", None)]
            + [("model.moe_token_dispatcher_type", "allgather")],
            [("model.moe_shared_expert_intermediate_size", 512), (A2A, True)],
            [("model.moe_shared_expert_intermediate_size", None), (A2A, True)],
        )
    ),
    # DeepSeek-V3's router: sigmoid, expert bias, groups
    [
        ("model.moe_router_score_function", "sigmoid"),
        ("model.moe_router_enable_expert_bias", True),
        ("model.moe_router_num_groups", 4),
        ("model.moe_router_group_topk", 2),
    ],
    # group-limited routing: per-group top topk // group_topk against a group's experts, and the
    # chosen groups against top-k (8 experts: 4 groups of 2, 8 groups of 1)
    *(
        [
            ("model.moe_router_num_groups", groups),
            ("model.moe_router_group_topk", group_topk),
            ("model.moe_router_topk", topk),
            ("model.moe_router_score_function", score),
        ]
        for groups, group_topk, topk in ((4, 1, 2), (4, 1, 4), (4, 2, 4), (4, 2, 5), (8, 2, 3))
        for score in ("softmax", "sigmoid")
    ),
    # biases in every linear layer (experts at ETP 1), with shared experts and without
    [("model.add_bias_linear", True), ("parallel.expert_tensor_parallel_size", 1)],
    [("model.add_bias_linear", True), ("parallel.expert_tensor_parallel_size", 1)]
    + [("model.moe_shared_expert_intermediate_size", 512)],
    # the alltoall overlap with a recompute method or layer count that nothing uses
    *(
        [(A2A, True), *moves]
        for moves in (
            [("model.recompute_method", "uniform")],
            [("model.recompute_num_layers", 1)],
            [("model.recompute_granularity", "selective"), ("model.recompute_method", "block")],
        )
    ),
]


def samples() -> list[tuple[list[tuple[str, object]], TrainingConfig]]:
    rng = random.Random(9)
    out = []
    for moves in CASES:
        cfg = base()
        for path, value in moves:
            _set(cfg, path, value)
        out.append((moves, cfg))
    fields = sorted(MOVES)
    for _ in range(SAMPLES):
        cfg = base()
        moves = [(f, rng.choice(MOVES[f])) for f in rng.sample(fields, rng.randint(1, 3))]
        for path, value in moves:
            _set(cfg, path, value)
        out.append((moves, cfg))
    return out


def _first_step(cfg: TrainingConfig, d: Partial, config) -> str | None:
    """What Megatron-Core 0.19.2 refuses after TransformerConfig: at initialize_model_parallel, at
    the model build, or in the first training step. Each from its source, cited."""
    m, par = cfg.model, cfg.parallel
    tp, pp, ep = (
        par.tensor_model_parallel_size,
        par.pipeline_model_parallel_size,
        par.expert_model_parallel_size,
    )
    etp, world = config.expert_tensor_parallel_size, d.world_size
    # parallel_state.initialize_model_parallel: the decoder and the expert grids.
    if world % (tp * pp * par.context_parallel_size):
        return "world not divisible by TP x PP x CP"
    if world % (etp * ep * pp):
        return "world not divisible by expert_tensor_model_pipeline_parallel size"
    if not m.num_moe_experts:
        return None
    if m.moe_first_k_dense_layers == m.num_layers:
        return "every layer dense (STRICTER moe_all_dense)"
    # MoELayer.__init__: assert num_moe_experts % ep_size == 0
    if m.num_moe_experts % ep:
        return "num_moe_experts % EP"
    try:
        # ColumnParallelLinear / RowParallelLinear (and TE's) divide their width by their TP group:
        # the experts by the expert TP group, shared experts and dense MLPs by TP.
        divide(config.moe_ffn_hidden_size, etp)
        if m.moe_shared_expert_intermediate_size:
            divide(m.moe_shared_expert_intermediate_size, tp)
        if 0 in config.moe_layer_freq:
            divide(config.ffn_hidden_size, tp)
    except AssertionError as err:
        return f"divide: {err}"
    # MoELayer.forward: raises in training when the attention TP group has >1 rank without SP.
    if tp > 1 and not par.sequence_parallel:
        return "MoE with TP > 1 needs sequence parallel"
    # MoEFlexTokenDispatcher.__init__, DeepEP backend (the default): assert tp_size * ep_size > 1,
    # tp_size being the expert TP group's. Its HybridEP branch asserts nothing of the kind.
    deepep = config.moe_flex_dispatcher_backend == "deepep"
    if m.moe_token_dispatcher_type == "flex" and deepep and etp * ep == 1:
        return "flex dispatcher (DeepEP) needs ETP x EP > 1"
    # TopKRouter.sinkhorn_load_balancing: assert moe_aux_loss_coeff == 0.
    if m.moe_router_load_balancing_type == "sinkhorn" and m.moe_aux_loss_coeff != 0:
        return "sinkhorn with an aux loss"
    # TopKRouter's torch.topk over num_moe_experts scores: k must not exceed them.
    if m.moe_router_topk > m.num_moe_experts:
        return "topk > num_moe_experts"
    return _routing(config)


def _routing(config) -> str | None:
    """Megatron-Core's own top-k routing (the router's first forward step) on random logits:
    refused when it raises, or routes a token to an expert with a weight that is not positive
    (STRICTER "group_limited_masked")."""
    if not config.moe_router_group_topk:
        return None
    logits = torch.randn(64, config.num_moe_experts, generator=torch.Generator().manual_seed(0))
    try:
        probs, routing_map = topk_routing_with_score_function(
            logits,
            config.moe_router_topk,
            use_pre_softmax=config.moe_router_pre_softmax,
            num_groups=config.moe_router_num_groups,
            group_topk=config.moe_router_group_topk,
            score_function=config.moe_router_score_function,
        )
    except RuntimeError as err:
        return f"group_limited_topk: {err}"
    if not (probs[routing_map] > 0).all():
        return "group-limited routing to masked-out experts (NaN or zero weights)"
    return None


def megatron_refuses(cfg: TrainingConfig, cluster: Cluster) -> str | None:
    d = finalize(cfg, cluster)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # the run's dtype, as the engine passes it (the alltoall overlap asserts BF16/FP16)
            dtype = getattr(torch, TORCH_DTYPES[d.preset.params_dtype])
            config = transformer_config(cfg, d, "cpu", dtype)
            get_gpt_decoder_layer_specs(config, use_transformer_engine=False)
    except (ValueError, AssertionError) as err:
        return f"{type(err).__name__}: {err}"
    return megatron_build.refuses(cfg, cluster) or _first_step(cfg, d, config)


def test_base_is_valid_on_both_sides() -> None:
    assert validate(base(), H100x8) == []
    assert megatron_refuses(base(), H100x8) is None


def test_checker_agrees_with_megatron_core() -> None:
    disagree, refused = [], 0
    for moves, cfg in samples():
        problems = validate(copy.deepcopy(cfg), H100x8)
        theirs = megatron_refuses(cfg, H100x8)
        refused += theirs is not None
        if bool(problems) != (theirs is not None):
            ours = [f"{p.field}: {p.message}" for p in problems]
            disagree.append(f"{moves}\n  checker: {ours}\n  Megatron-Core: {theirs}")
    total = SAMPLES + len(CASES)
    print(f"MoE oracle: {total - len(disagree)}/{total} agree ({refused} refused by Megatron-Core)")
    assert not disagree, f"{len(disagree)} of {total} disagree:\n" + "\n".join(disagree)
    # The sample must exercise both verdicts.
    assert 0.2 * total < refused < 0.9 * total
