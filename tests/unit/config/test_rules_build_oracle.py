"""The checker against Megatron-Core's own constructors, rule by rule.

Each config is built by Megatron-Core on every pipeline stage of its world, on torch's fake process
group and the meta device (tests/support/megatron_build.py: the engine's parallel state and
`transformer_config`, the architecture's builder, LoRA's adapters), and the checker must give
Megatron-Core's verdict, also where only a later stage builds what Megatron-Core refuses. Where
Megatron-Core refuses only in the first training step, the test runs the Megatron-Core function
that refuses (LLaVA's sequence padding). The MoE rules that Megatron-Core applies when it builds
(shared experts' biases, group-limited routing, the alltoall overlap's recompute) are held in the
sampled oracle, tests/unit/config/test_rules_moe_oracle.py, which builds every config too.
"""

from __future__ import annotations

import math
import sys
import types
from unittest import mock

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from megatron.core.models.multimodal.llava_model import LLaVAModel  # noqa: E402

import models.specs as specs  # noqa: E402
from config.backend import local_layers  # noqa: E402
from config.hardware import Cluster  # noqa: E402
from config.rules import validate  # noqa: E402
from config.schema import TrainingConfig  # noqa: E402
from config.tree import apply_overrides  # noqa: E402
from recipes.advice.check import check  # noqa: E402
from recipes.registry import resolve  # noqa: E402
from tests.support import megatron_build  # noqa: E402
from tests.unit.config.test_rules_moe_oracle import base as moe_base  # noqa: E402
from tests.unit.config.test_validation import H100x8, llama_like  # noqa: E402

CPUx8 = Cluster(num_nodes=1, gpus_per_node=8, gpu="cpu")
# llama_like (TP 2 with SP on 8 H100s) at a size that builds in milliseconds
SMALL = (
    "model.num_layers=2",
    "model.hidden_size=256",
    "model.ffn_hidden_size=512",
    "model.num_attention_heads=8",
    "model.num_query_groups=4",
    "model.vocab_size=1024",
    "model.seq_length=512",
)
MLA = (
    "model.multi_latent_attention=true",
    "model.kv_lora_rank=64",
    "model.qk_head_dim=32",
    "model.qk_pos_emb_head_dim=16",
    "model.v_head_dim=32",
)
LORA = ("peft.scheme=lora",)
MLA_LORA = (*MLA, *LORA, "peft.target_modules=linear_proj")


def small(*overrides: str) -> TrainingConfig:
    return apply_overrides(llama_like(), [*SMALL, *overrides])


def problems(cfg: TrainingConfig, cluster: Cluster = H100x8) -> list[str]:
    return [f"{p.field}: {p.message}" for p in validate(cfg, cluster)]


# --- sequence parallel in Megatron-Core's local layers (LoRA builds them on GPUs too) ---------


@pytest.mark.parametrize(
    "overrides",
    [
        LORA,
        (*LORA, "model.qk_layernorm=true"),
        (*LORA, "model.mtp_num_layers=1"),
        (*MLA_LORA, "model.qk_layernorm=true", "model.q_lora_rank=64"),
        (),  # a GPU without Transformer Engine builds the same layers
    ],
)
def test_local_layers_run_sequence_parallel(overrides: tuple[str, ...]) -> None:
    """Megatron-Core's torch norm refuses SP; the local spec's norms take SP the way its apex and
    TE norms do, each parameter marked for the TP sum of its gradient (models/specs.py)."""
    cfg = small(*overrides)
    assert cfg.parallel.sequence_parallel and problems(cfg) == []
    stages = megatron_build.build(cfg, H100x8)
    norms = [
        (n, p) for cs in stages.values() for c in cs for n, p in c.named_parameters() if "norm" in n
    ]
    assert norms
    assert [n for n, p in norms if not getattr(p, "sequence_parallel", False)] == []


@pytest.mark.parametrize("recipe", ["llama3_8b_sft", "qwen3_8b_sft", "qwen25_7b_sft"])
def test_lora_on_a_catalog_recipe_with_sequence_parallel(recipe: str) -> None:
    """`recipes check RECIPE peft.scheme=lora` accepts TP with SP, and Megatron-Core builds that
    model at full size (on the meta device)."""
    found, cfg = resolve(recipe, list(LORA))
    assert cfg.parallel.sequence_parallel
    assert check(cfg, found.cluster, suggest_fixes=False).exit_code == 0
    assert megatron_build.refuses(cfg, found.cluster) is None


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_checker_and_the_builder_agree_on_local_layers(lora: bool, device: str) -> None:
    """One answer to "local layers or Transformer Engine's": the builder's, where TE imports."""
    with mock.patch.object(specs, "have_transformer_engine", lambda: True):
        backend = specs.choose_backend(device, lora)
    assert (backend == "sdpa") == (local_layers(lora, device) is not None)


# --- multi-latent attention's query norm in the local layers -----------------------------------


@pytest.mark.parametrize("qk_layernorm", [False, True])
@pytest.mark.parametrize("q_lora_rank", [None, 64])
@pytest.mark.parametrize(
    "rest, cluster",
    [
        (LORA + ("peft.target_modules=linear_proj",), H100x8),  # LoRA on GPUs: local layers
        (("parallel.sequence_parallel=false", "parallel.tensor_model_parallel_size=1"), CPUx8),
    ],
    ids=["lora_gpu", "cpu"],
)
def test_mla_query_norm_needs_q_lora_rank_in_local_layers(
    qk_layernorm: bool, q_lora_rank: int | None, rest: tuple[str, ...], cluster: Cluster
) -> None:
    cfg = small(
        *MLA, *rest, f"model.qk_layernorm={qk_layernorm}", f"model.q_lora_rank={q_lora_rank}"
    )
    ours = problems(cfg, cluster)
    theirs = megatron_build.refuses(cfg, cluster)
    assert bool(ours) == (theirs is not None), (ours, theirs)
    if ours:
        [message] = ours
        assert message.startswith("model.q_lora_rank: is unset with model.qk_layernorm=true")
        assert "q_lora_rank is None" in theirs


# --- MoE: the shared experts' biases, the expert grid ------------------------------------------


@pytest.mark.parametrize("shared", [None, 512])
@pytest.mark.parametrize("bias", [False, True])
def test_shared_experts_take_no_bias(bias: bool, shared: int | None) -> None:
    cfg = moe_base()
    apply_overrides(
        cfg,
        [
            f"model.add_bias_linear={bias}",
            f"model.moe_shared_expert_intermediate_size={shared}",
            "parallel.expert_tensor_parallel_size=1",  # expert biases need ETP 1 (their own rule)
        ],
    )
    ours, theirs = problems(cfg), megatron_build.refuses(cfg, H100x8)
    assert bool(ours) == (theirs is not None) == (bias and shared is not None), (ours, theirs)
    if ours:
        assert ours[0].startswith("model.add_bias_linear: is true with shared experts")
        assert "bias is not supported in the shared experts" in theirs


@pytest.mark.parametrize(
    "overrides, field",
    [
        # from the base (TP 2, EP 4, ETP unset = TP: 8 of 8 ranks), one size changed
        (["parallel.expert_tensor_parallel_size=4"], "parallel.expert_tensor_parallel_size"),
        (["parallel.expert_model_parallel_size=8"], "parallel.expert_model_parallel_size"),
        (["parallel.tensor_model_parallel_size=4"], "parallel.expert_model_parallel_size"),
        (["parallel.expert_tensor_parallel_size=3"], "parallel.expert_tensor_parallel_size"),
    ],
)
def test_the_expert_grid_names_the_size_to_change(overrides: list[str], field: str) -> None:
    """EP x ETP must divide a pipeline stage's ranks (Megatron-Core's parallel state refuses it):
    the problem names the size that cannot stay, and the message both fields with their choices."""
    cfg = apply_overrides(moe_base(), overrides)
    grid = [p for p in validate(cfg, H100x8) if p.message.startswith("EP x ETP")]
    assert [p.field for p in grid] == [field]
    message = grid[0].message
    assert "parallel.expert_model_parallel_size=" in message
    assert "parallel.expert_tensor_parallel_size" in message
    assert "expert_tensor_model_pipeline_parallel" in (megatron_build.refuses(cfg, H100x8) or "")


@pytest.mark.parametrize("dense", [3, 4, 5])
def test_an_moe_model_keeps_an_moe_layer(dense: int) -> None:
    """Dense first layers up to all but one. With every layer dense the checker is stricter than
    Megatron-Core, which builds a dense model and ignores the MoE fields (test_rules_moe_oracle's
    STRICTER "moe_all_dense"); with more than the model has, Megatron-Core refuses too."""
    cfg = apply_overrides(moe_base(), [f"model.moe_first_k_dense_layers={dense}"])
    ours, theirs = problems(cfg), megatron_build.refuses(cfg, H100x8)
    assert (theirs is None) == (dense <= 4), theirs
    if dense < 4:
        assert ours == []
    else:
        [message] = ours
        assert message.startswith(f"model.moe_first_k_dense_layers: is {dense} with model.num_")
        assert "use at most 3, or unset model.num_moe_experts" in message


# --- every pipeline stage: what only a later stage builds ---------------------------------------

# moe_base on two pipeline stages, each config refused by a layer that stage 0 does not hold: with
# the first two layers dense, stage 0 holds no MoE layer; with an embedding-only first stage
# (layout "E|ttttL"), the one dense layer is stage 1's.
DENSE_STAGE_0 = ("model.moe_first_k_dense_layers=2",)
EMBEDDING_STAGE_0 = (
    "parallel.pipeline_model_parallel_layout=E|ttttL",
    "model.moe_first_k_dense_layers=1",
    "parallel.expert_tensor_parallel_size=1",
)


@pytest.mark.parametrize(
    "overrides, field, says",
    [
        pytest.param(
            (
                *DENSE_STAGE_0,
                "model.add_bias_linear=true",
                "model.moe_shared_expert_intermediate_size=512",
                "parallel.expert_tensor_parallel_size=1",
                "parallel.expert_model_parallel_size=2",
            ),
            "model.add_bias_linear",
            "bias is not supported in the shared experts",
            id="shared_expert_bias",
        ),
        pytest.param(
            (
                *DENSE_STAGE_0,
                "model.moe_ffn_hidden_size=510",
                "parallel.tensor_model_parallel_size=4",
                "parallel.expert_model_parallel_size=1",
            ),
            "model.moe_ffn_hidden_size",
            "255 is not divisible by 2",
            id="expert_width_over_etp",
        ),
        pytest.param(
            (
                *DENSE_STAGE_0,
                "model.num_moe_experts=6",
                "parallel.tensor_model_parallel_size=1",
                "parallel.sequence_parallel=false",
            ),
            "parallel.expert_model_parallel_size",
            "when instantiating TransformerLayer",  # MoELayer's assert has no message
            id="experts_over_ep",
        ),
        pytest.param(
            (
                *EMBEDDING_STAGE_0,
                "model.ffn_hidden_size=1026",
                "parallel.tensor_model_parallel_size=4",
            ),
            "parallel.tensor_model_parallel_size",
            "513 is not divisible by 2",
            id="dense_width_over_tp",
        ),
    ],
)
def test_a_later_pipeline_stage_refuses(overrides: tuple[str, ...], field: str, says: str) -> None:
    """The checker and Megatron-Core refuse each; stage 0 alone builds (a build of rank 0's chunks
    would accept), stage 1 is refused."""
    cfg = apply_overrides(moe_base(), ["parallel.pipeline_model_parallel_size=2", *overrides])
    assert [p.field for p in validate(cfg, H100x8)] == [field]
    assert megatron_build.build_stage(cfg, H100x8, 0)
    with pytest.raises(megatron_build.REFUSALS, match=says):
        megatron_build.build_stage(cfg, H100x8, 1)
    assert says in (megatron_build.refuses(cfg, H100x8) or "")


@pytest.mark.parametrize("layout", [None, "Et|t|t|tmL"], ids=["even_split", "two_chunks_per_stage"])
def test_each_pipeline_stage_builds_its_own_part(layout: str | None) -> None:
    """Tied embeddings and an MTP layer over two stages: the embedding on the first, the MTP
    layer and the output layer on the last (with a copy of the embedding, which Megatron-Core
    moves to the GPU and sums with the first stage's at build time), each chunk as the engine's
    parallel state gives it (the MTP layer in the last virtual stage)."""
    cfg = small(
        "model.num_layers=4",
        "model.mtp_num_layers=1",
        "model.share_embeddings_and_output_weights=true",
        "parallel.pipeline_model_parallel_size=2",
        f"parallel.pipeline_model_parallel_layout={layout}",
    )
    assert problems(cfg) == []
    hook = sys.excepthook
    built = megatron_build.build(cfg, H100x8)
    assert sys.excepthook is hook  # torch's rank-prefixing hook does not pile up over builds
    parts = {
        stage: [sorted({name.split(".")[0] for name, _ in c.named_parameters()}) for c in chunks]
        for stage, chunks in built.items()
    }
    last = ["decoder", "embedding", "mtp", "output_layer"]
    if layout is None:
        assert parts == {0: [["decoder", "embedding"]], 1: [last]}
    else:
        assert parts == {0: [["decoder", "embedding"], ["decoder"]], 1: [["decoder"], last]}


def test_big_worlds_build_the_first_two_stages_and_the_last() -> None:
    """Each stage as one of its own ranks (asserted in `build_stage`), on 64 and 1024 GPUs."""
    cfg = small("model.num_layers=8", "parallel.pipeline_model_parallel_size=8")
    for nodes, stages in ((8, list(range(8))), (128, [0, 1, 7])):
        cluster = Cluster(num_nodes=nodes, gpus_per_node=8, gpu="h100")
        assert problems(cfg, cluster) == []
        assert list(megatron_build.build(cfg, cluster)) == stages


# --- LLaVA: the model pads its sequence for SP and CP; the ViT derives its head size ------------


@pytest.mark.filterwarnings("ignore:Warning. tp_group is None:DeprecationWarning")
@pytest.mark.parametrize("tp, cp", [(2, 1), (4, 1), (1, 2), (2, 2)])
def test_llava_pads_its_sequence_for_sequence_and_context_parallel(tp: int, cp: int) -> None:
    seq = 4099  # divisible by no TP x CP split
    sp = tp > 1
    found, cfg = resolve(
        "llava_llama3_8b_sft",
        [
            f"model.seq_length={seq}",
            f"parallel.tensor_model_parallel_size={tp}",
            f"parallel.context_parallel_size={cp}",
            f"parallel.sequence_parallel={sp}",
        ],
    )
    assert problems(cfg, found.cluster) == []
    # Megatron-Core's LLaVAModel, on the embeddings of a full sequence (text and image positions)
    model = types.SimpleNamespace(
        pre_process=True,
        post_process=True,
        context_parallel_lm=cp,
        sequence_parallel_lm=sp,
        tensor_model_parallel_size_lm=tp,
        tp_comm_overlap_lm=False,
    )
    embeddings = torch.zeros(seq, 1, 8) if cp == 1 else torch.zeros(1, seq, 8)
    labels, loss_mask = torch.zeros(1, seq, dtype=torch.long), torch.ones(1, seq)
    with megatron_build.fake_world(cfg, found.cluster):
        out, labels, loss_mask, _ = LLaVAModel._process_embedding_token_parallel(
            model, embeddings, labels, loss_mask, None
        )
    # padded to a multiple of the split, then this rank's share: [s / (CP x TP), b, h]
    split = (tp if sp else 1) * (2 * cp if cp > 1 else 1)
    assert out.shape[0] == math.ceil(seq / split) * split // (cp * (tp if sp else 1))
    assert labels.shape == loss_mask.shape


def test_gpt_still_needs_the_sequence_to_divide() -> None:
    """GPTModel pads nothing: the same sequence length is refused for a GPT model."""
    cfg = small("model.seq_length=4099")
    assert [p.split(":")[0] for p in problems(cfg)] == ["model.seq_length"]


@pytest.mark.parametrize("hidden, heads", [(64, 4), (66, 4), (60, 8)])
def test_the_vision_tower_derives_its_head_size(hidden: int, heads: int) -> None:
    """kv_channels = hidden_size // num_attention_heads, as Megatron-Core derives it: a hidden
    size that the heads do not divide builds."""
    found, cfg = resolve(
        "tiny_llava_pretrain",
        [f"model.vision.hidden_size={hidden}", f"model.vision.num_attention_heads={heads}"],
    )
    assert problems(cfg, found.cluster) == []
    assert megatron_build.refuses(cfg, found.cluster) is None


# --- GPT-OSS: windows on every other layer, sinks, the clamped GLU, biased experts and router ---
GPT_OSS = (
    "model.add_bias_linear=true",
    "model.softmax_type=learnable",
    "model.window_size=127",
    "model.window_attn_skip_freq=2",
    "model.activation=quick_geglu",
    "model.activation_func_clamp_value=7.0",
    "model.glu_linear_offset=1.0",
    "model.rope_scaling=yarn",
    "model.rope_scaling_factor=32",
    "model.rope_correction_range_round_to_int=false",
    "model.moe_router_load_balancing_type=none",
    "parallel.expert_tensor_parallel_size=1",  # expert biases need ETP 1
)
SFT_PACKED = (
    "data.kind=sft",
    "data.path=/data/x.jsonl",
    "data.tokenizer=/t.json",
    "data.sequence_packing=true",
)


def test_gpt_oss_layers_build_as_published() -> None:
    """The MoE base (TP 2 with SP, EP 4) with GPT-OSS's attention and experts: both sides accept
    it, layers 1 and 3 (from 1) only are windowed, each TP rank keeps its share of the sinks, and
    the router and the experts get their biases."""
    cfg = apply_overrides(moe_base(), list(GPT_OSS))
    assert problems(cfg) == []
    [chunk] = megatron_build.build(cfg, H100x8)[0]
    layers = chunk.decoder.layers
    # The oracle builds the local spec here (no Transformer Engine): SdpaAttention, the CPU's.
    windows = [layer.self_attention.core_attention.window for layer in layers]
    assert windows == [(127, 0), None, (127, 0), None]
    for layer in layers:
        assert layer.self_attention.core_attention.softmax_offset.shape == (8 // 2,)  # heads / TP
        assert layer.mlp.router.bias is not None
        assert layer.self_attention.linear_qkv.bias is not None
        expert = layer.mlp.experts.local_experts[0]
        assert expert.linear_fc1.bias is not None and expert.linear_fc2.bias is not None
    assert type(chunk.rotary_pos_emb).__name__ == "YarnRotaryEmbedding"
    assert not chunk.rotary_pos_emb.correction_range_round_to_int


@pytest.mark.parametrize(
    "overrides, field, megatron_says",
    [
        # Megatron-Core's TransformerConfig: "Bias in Moe is only supported when ETP==1".
        (("parallel.expert_tensor_parallel_size=2",), "model.add_bias_linear", "ETP==1"),
        (("parallel.expert_tensor_parallel_size=None",), "model.add_bias_linear", "ETP==1"),
        # Stricter: Megatron-Core builds these and ignores the frequency.
        (("model.window_size=None",), "model.window_attn_skip_freq", None),
        (("model.window_attn_skip_freq=1",), "model.window_attn_skip_freq", None),
    ],
)
def test_gpt_oss_rules_match_megatron_core(
    overrides: tuple[str, ...], field: str, megatron_says: str | None
) -> None:
    cfg = apply_overrides(moe_base(), [*GPT_OSS, *overrides])
    ours, theirs = problems(cfg), megatron_build.refuses(cfg, H100x8)
    assert [p.split(":")[0] for p in ours] == [field], ours
    if megatron_says is None:
        assert theirs is None  # accepted there, the field ignored: the checker is stricter
    else:
        assert megatron_says in (theirs or ""), theirs


@pytest.mark.parametrize("packed", [False, True])
def test_gpt_oss_sft_builds_packed_or_not(packed: bool) -> None:
    """Packed rows take the SDPA core attention with the rows' mask, which applies the window and
    the sinks too (models/sdpa.py SdpaAttention): every layer gets it, with its sinks."""
    cfg = apply_overrides(moe_base(), [*GPT_OSS, *SFT_PACKED, f"data.sequence_packing={packed}"])
    assert problems(cfg) == [] and megatron_build.refuses(cfg, H100x8) is None
    if packed:
        [chunk] = megatron_build.build(cfg, H100x8)[0]
        for layer in chunk.decoder.layers:
            attention = layer.self_attention.core_attention
            assert type(attention) is specs.SdpaAttention
            assert attention.softmax_offset is not None
