"""The checker against Megatron-Core's own build, on combinations of changes to catalog recipes.

Each sample starts from a real catalog recipe (`recipes.registry.resolve`) made small enough to
build in milliseconds (BASES: four to eight layers of width 256, as test_rules_build_oracle's
SMALL), on eight H100s, and applies two to four changes drawn near the checker's rules (GROUPS):
LoRA, LLaVA's vision tower and its SP / CP, Megatron-FSDP, MoE routing and dispatch, pipeline
layouts, and the TP / SP / PP / VPP / CP / EP / ETP sizes. Its verdicts:

- the checker's: `config.rules.validate` finds problems or not, and each problem names a field;
- Megatron-Core's: `megatron_build.refuses`, every pipeline stage built on torch's fake process
  group and the meta device (tests/support/megatron_build.py). That build has Megatron-Core's
  local layers where a GPU run without LoRA has Transformer Engine's: what only the latter builds
  (context parallelism, LLaVA's sequence parallelism) is built turned off, after Megatron-Core
  has set up its process groups with it (`megatron_refuses`).

They must agree, except where the checker refuses on purpose what Megatron-Core builds (DELIBERATE:
each rule with why; a sample the checker refuses for those rules only, and Megatron-Core builds, is
counted as stricter by design). The test prints (see it with -s) "combined oracle: N samples, A
agree, S stricter by design, D disagree".
"""

from __future__ import annotations

import copy
import random
import warnings
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from config.backend import local_layers  # noqa: E402
from config.hardware import Cluster  # noqa: E402
from config.problems import Problem  # noqa: E402
from config.rules import validate  # noqa: E402
from config.schema import TrainingConfig, masks_packed_rows  # noqa: E402
from config.tree import apply_overrides  # noqa: E402
from recipes.registry import resolve  # noqa: E402
from tests.support import megatron_build  # noqa: E402

H100x8 = Cluster(num_nodes=1, gpus_per_node=8, gpu="h100")
SEED = 20
SAMPLES = 400

# The language model of every base: test_rules_build_oracle's SMALL, with a batch every layout
# here divides.
SMALL = (
    "model.num_layers=4",
    "model.hidden_size=256",
    "model.ffn_hidden_size=512",
    "model.num_attention_heads=8",
    "model.num_query_groups=4",
    "model.kv_channels=32",
    "model.vocab_size=1024",
    "model.seq_length=512",
    "train.global_batch_size=64",
    "train.micro_batch_size=1",
    "checkpoint.pretrained_dir=None",
)
MOE = (
    "model.num_moe_experts=16",
    "model.moe_ffn_hidden_size=256",
    "parallel.expert_tensor_parallel_size=1",
)

# Catalog recipe -> its small form on eight H100s (both sides accept each: test_bases_...).
BASES: dict[str, tuple[str, ...]] = {
    # dense, TP 2 with SP
    "llama3_8b_sft": SMALL,
    # dense with per-head query/key norms, TP 4 with SP
    "qwen3_8b_pretrain": SMALL,
    # LoRA on every linear layer, packed chat rows (their explicit mask: SDPA attention)
    "llama3_8b_lora": SMALL,
    # MoE, top 2 of 8, PP 2 x VPP 2, EP 4
    "mixtral_8x7b_pretrain": (
        *SMALL,
        "model.num_layers=8",
        "model.num_moe_experts=8",
        "model.moe_ffn_hidden_size=256",
        "parallel.pipeline_model_parallel_size=2",
        "parallel.virtual_pipeline_model_parallel_size=2",
        "parallel.expert_model_parallel_size=4",
    ),
    # MoE, top 8 of 16, EP 8, ETP 1
    "qwen3_30b_a3b_pretrain": (*SMALL, *MOE, "parallel.expert_model_parallel_size=8"),
    # MLA, sigmoid group-limited routing with expert bias, shared experts, a dense first layer,
    # one MTP layer, PP 2, EP 4
    "deepseek_v3_pretrain": (
        *SMALL,
        *MOE,
        "model.q_lora_rank=64",
        "model.kv_lora_rank=64",
        "model.qk_head_dim=32",
        "model.qk_pos_emb_head_dim=16",
        "model.v_head_dim=32",
        "model.moe_shared_expert_intermediate_size=256",
        "model.moe_first_k_dense_layers=1",
        "model.moe_router_num_groups=4",
        "model.moe_router_group_topk=2",
        "model.moe_router_topk=4",
        "model.recompute_modules=mla_up_proj",
        "parallel.tensor_model_parallel_size=1",
        "parallel.sequence_parallel=false",
        "parallel.pipeline_model_parallel_size=2",
        "parallel.virtual_pipeline_model_parallel_size=None",
        "parallel.expert_model_parallel_size=4",
    ),
    # LLaVA: a small ViT (64 wide, 4 heads, 32 x 32 images of 8 x 8 patches), TP 2 with SP
    "llava_llama3_8b_sft": (
        *SMALL,
        "model.vision.num_layers=2",
        "model.vision.hidden_size=64",
        "model.vision.ffn_hidden_size=128",
        "model.vision.num_attention_heads=4",
        "model.vision.image_size=32",
        "model.vision.patch_size=8",
    ),
}

# Each change: a field and the values to draw, near a rule; or a name and tuples of overrides
# that make one change together.
PP2 = (
    "parallel.pipeline_model_parallel_size=2",
    "parallel.virtual_pipeline_model_parallel_size=None",
)
SIZES: dict[str, list[object]] = {
    # an even split, an embedding-only first stage, MTP on the last stage (in its last chunk when
    # the layout gives each rank two), a loss-only last stage
    "pipeline layout": [
        (*PP2, "parallel.pipeline_model_parallel_layout=None"),
        (*PP2, "parallel.pipeline_model_parallel_layout=E|ttttL"),
        (*PP2, "parallel.pipeline_model_parallel_layout=Ettt|tmL"),
        (*PP2, "parallel.pipeline_model_parallel_layout=Et|t|t|tmL"),
        (*PP2, "parallel.pipeline_model_parallel_layout=Ett|tt|m|L"),
        (
            "parallel.pipeline_model_parallel_size=4",
            "parallel.virtual_pipeline_model_parallel_size=None",
            "parallel.pipeline_model_parallel_layout=E|tt|tt|L",
        ),
    ],
    "parallel.tensor_model_parallel_size": [1, 2, 4, 8],
    "parallel.sequence_parallel": [True, False],
    "parallel.pipeline_model_parallel_size": [1, 2, 4],
    "parallel.virtual_pipeline_model_parallel_size": [None, 2],
    "parallel.context_parallel_size": [1, 2],
    "parallel.expert_model_parallel_size": [1, 2, 4, 8],
    "parallel.expert_tensor_parallel_size": [None, 1, 2],
}
LORA: dict[str, list[object]] = {
    "peft.scheme": ["lora", "lora", "none"],
    "peft.target_modules": [
        "linear_qkv,linear_proj,linear_fc1,linear_fc2",
        "linear_qkv,linear_proj",
        "linear_fc1,linear_fc2",
        "linear_proj",
    ],
    "peft.rank": [8, 16],
}
FSDP: dict[str, list[object]] = {
    "parallel.use_megatron_fsdp": [True, True, False],
    "optimizer.use_distributed_optimizer": [True, False],
    "precision": ["bf16_mixed", "fp16_mixed", "fp32"],
}
VISION: dict[str, list[object]] = {
    "model.vision.hidden_size": [64, 60, 66, 96],
    "model.vision.num_attention_heads": [4, 3, 8],
    "model.vision.ffn_hidden_size": [128, 130],
    "model.vision.projector_hidden_size": [None, 256, 254],
    "model.vision.image_size": [32, 24, 36],
    "model.seq_length": [512, 510, 514],
}
GROUP_LIMITED = (
    "model.moe_router_num_groups",
    "model.moe_router_group_topk",
    "model.moe_router_topk",
)
ROUTING: dict[str, list[object]] = {
    # (groups, groups chosen, top k): within the chosen groups, beyond them (masked-out experts),
    # groups scored by more experts than they hold; on 16 experts (8 in Mixtral)
    "group-limited routing": [
        tuple(f"{f}={v}" for f, v in zip(GROUP_LIMITED, values, strict=True))
        for values in ((4, 2, 4), (8, 2, 5), (8, 2, 4), (4, 1, 8), (4, 2, 9), (2, 1, 8), (16, 4, 4))
    ],
    "model.moe_router_topk": [1, 2, 4, 8, 10],
    "model.moe_router_score_function": ["softmax", "sigmoid"],
    "model.moe_router_pre_softmax": [False, True],
    "model.moe_router_enable_expert_bias": [False, True],
    "model.moe_router_num_groups": [None, 2, 4, 8],
    "model.moe_router_group_topk": [None, 1, 2, 4],
    "model.moe_shared_expert_intermediate_size": [None, 256, 254],
    "model.moe_token_dispatcher_type": ["alltoall", "allgather", "flex"],
    "model.moe_first_k_dense_layers": [0, 1, 2, 4],
}
GROUPS = {"sizes": SIZES, "lora": LORA, "fsdp": FSDP, "vision": VISION, "routing": ROUTING}
# The groups drawn for each kind of base: a field that a base does not have (the vision tower of
# a GPT) is not drawn.
FOR_GPT = ("sizes", "lora", "fsdp")
FOR_MOE = ("sizes", "lora", "fsdp", "routing")
FOR_LLAVA = ("sizes", "vision", "fsdp", "lora")

# Rules where the checker refuses on purpose what Megatron-Core builds: rule -> (why, which of
# the checker's problems it is).
DELIBERATE: dict[str, tuple[str, Callable[[Problem], bool]]] = {
    "megatron_fsdp": (
        "Megatron-FSDP with PP > 1, MoE layers, LoRA, FP32 weights or a model other than GPT, or "
        "without the distributed optimizer (config/rules/fsdp.py, each rule with its reason): "
        "measured failures of this engine's saves, resumes and gradients, or a setting Megatron-LM "
        "changes by itself; Megatron-Core builds the model either way (the oracle does not build "
        "Megatron-FSDP's wrapper)",
        lambda p: "Megatron-FSDP" in p.message,
    ),
    "moe_tp_without_sp": (
        "MoE layers with TP > 1 and no sequence parallel: Megatron-Core's MoELayer.forward raises "
        "in the first training step, after the build",
        lambda p: p.field == "parallel.sequence_parallel" and "MoE" in p.message,
    ),
    "topk_above_experts": (
        "moe_router_topk above model.num_moe_experts: Megatron-Core's router fails in the first "
        "training step (torch.topk over the experts' scores)",
        lambda p: p.field == "model.moe_router_topk" and "top k of" in p.message,
    ),
    "group_limited_first_step": (
        "group-limited routing whose groups are scored by more experts than they hold "
        "(moe_router_topk // group_topk > experts per group): Megatron-Core's group_limited_topk "
        "fails in the first training step",
        lambda p: p.field == "model.moe_router_group_topk" and "first step" in p.message,
    ),
    "group_limited_masked": (
        "group-limited routing where moe_router_topk > group_topk x experts per group: "
        "Megatron-Core builds and runs it, but routes the rest of the top k to experts of "
        "masked-out groups with NaN (sigmoid, pre-softmax) or zero weights",
        lambda p: p.field == "model.moe_router_group_topk" and "masked out" in p.message,
    ),
    "moe_all_dense": (
        "model.moe_first_k_dense_layers = model.num_layers: Megatron-Core builds every layer dense "
        "and ignores the MoE fields",
        lambda p: p.field == "model.moe_first_k_dense_layers" and "every layer" in p.message,
    ),
    "chunks_without_pp": (
        "virtual pipeline stages (VPP, or a layout of several chunks) with PP 1: the engine builds "
        "one chunk per rank when PP is 1 (models/gpt.py chunks_per_rank), so the field would be "
        "ignored without a word, or the later chunks' layers never built",
        lambda p: (
            "virtual stages interleave a pipeline and need" in p.message
            or "interleave a pipeline and need pipeline_model_parallel_size > 1" in p.message
        ),
    ),
    "llava_pp": (
        "arch llava with PP > 1: the engine builds LLaVA's encoder, projector and language model "
        "in one pipeline stage (models/llava.py); Megatron-Core's LLaVAModel, built so, would "
        "hold the embedding, the encoder and the loss on every stage",
        lambda p: p.field == "parallel.pipeline_model_parallel_size" and "llava" in p.message,
    ),
    "lora_absent_target": (
        "a LoRA target module the architecture does not have: training/lora.py `adapt` adapts "
        "nothing in its place, without a word",
        lambda p: p.field == "peft.target_modules" and "does not have" in p.message,
    ),
}


def deliberate(problem: Problem) -> str | None:
    """The DELIBERATE rule `problem` comes from, or None."""
    return next((key for key, (_, match) in DELIBERATE.items() if match(problem)), None)


def _groups(cfg: TrainingConfig) -> tuple[str, ...]:
    if cfg.model.arch == "llava":
        return FOR_LLAVA
    return FOR_MOE if cfg.model.num_moe_experts else FOR_GPT


def _overrides(field: str, value: object) -> list[str]:
    return list(value) if isinstance(value, tuple) else [f"{field}={value}"]


def samples() -> list[tuple[str, list[str], TrainingConfig]]:
    """(recipe, changes, config), seeded: each base with 2-4 changes from its groups."""
    rng = random.Random(SEED)
    bases = {name: resolve(name, list(overrides))[1] for name, overrides in BASES.items()}
    out = []
    for _ in range(SAMPLES):
        name = rng.choice(sorted(bases))
        cfg = copy.deepcopy(bases[name])
        fields = {f: values for g in _groups(cfg) for f, values in GROUPS[g].items()}
        changes = [
            override
            for f in rng.sample(sorted(fields), rng.randint(2, 4))
            for override in _overrides(f, rng.choice(fields[f]))
        ]
        out.append((name, changes, apply_overrides(cfg, changes)))
    return out


def transformer_engine_only(cfg: TrainingConfig) -> list[str]:
    """What a GPU run of `cfg` builds with Transformer Engine's layers and the oracle cannot build
    with Megatron-Core's local ones, as the overrides that turn it off: context parallelism (the
    local attention has none), and LLaVA's sequence parallelism (LLaVAModel asserts TE's
    attention). Nothing for a run that builds the local layers on GPUs too (LoRA); and context
    parallelism stays where packed rows take SDPA's core attention on GPUs too."""
    if local_layers(cfg.peft.scheme == "lora", "cuda") is not None:
        return []
    off = []
    if cfg.parallel.context_parallel_size > 1 and not masks_packed_rows(cfg):
        off.append("parallel.context_parallel_size=1")
    # (With TP 1, Megatron-Core's TransformerConfig refuses SP before any layer is built.)
    par = cfg.parallel
    if cfg.model.arch == "llava" and par.sequence_parallel and par.tensor_model_parallel_size > 1:
        off.append("parallel.sequence_parallel=false")
    return off


def megatron_refuses(cfg: TrainingConfig) -> str | None:
    """Megatron-Core's verdict (`megatron_build.refuses`). For what only Transformer Engine builds
    (`transformer_engine_only`), Megatron-Core first sets up its process groups at the sample's
    own sizes, then builds the sample with that turned off: neither changes a module's
    parameters, only the attention kernel and the tokens each rank holds (the checker's rules on
    those are held against Megatron-Core's own code in test_rules_model_oracle and
    test_rules_build_oracle's LLaVA test)."""
    off = transformer_engine_only(cfg)
    if off:
        try:
            with megatron_build.fake_world(cfg, H100x8):
                pass
        except megatron_build.REFUSALS as err:
            return f"{type(err).__name__}: {err}"
        cfg = apply_overrides(copy.deepcopy(cfg), off)
    return megatron_build.refuses(cfg, H100x8)


def verdicts(cfg: TrainingConfig) -> tuple[list[Problem], str | None]:
    """(the checker's problems, Megatron-Core's refusal or None)."""
    problems = validate(copy.deepcopy(cfg), H100x8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return problems, megatron_refuses(cfg)


@pytest.mark.parametrize("name", sorted(BASES))
def test_bases_are_valid_on_both_sides(name: str) -> None:
    _, cfg = resolve(name, list(BASES[name]))
    problems, refusal = verdicts(cfg)
    assert [f"{p.field}: {p.message}" for p in problems] == [] and refusal is None


def test_checker_agrees_with_megatron_core() -> None:
    agree, stricter, disagree = 0, 0, []
    refused, rules = 0, set()
    for name, changes, cfg in samples():
        problems, refusal = verdicts(cfg)
        assert all(p.field for p in problems), problems  # every refusal names a field
        refused += bool(problems)
        if bool(problems) == (refusal is not None):
            agree += 1
        elif problems and all(deliberate(p) for p in problems):
            stricter += 1
            rules |= {deliberate(p) for p in problems}
        else:
            ours = [f"{p.field}: {p.message}" for p in problems]
            disagree.append(f"{name} {changes}\n  checker: {ours}\n  Megatron-Core: {refusal}")
    print(
        f"combined oracle: {SAMPLES} samples, {agree} agree, {stricter} stricter by design, "
        f"{len(disagree)} disagree"
    )
    assert not disagree, f"{len(disagree)} of {SAMPLES} disagree:\n" + "\n".join(disagree)
    # The sample must exercise both verdicts, and every deliberate rule (one that no sample
    # reaches would excuse nothing the test can see).
    assert 0.2 * SAMPLES < refused < 0.9 * SAMPLES
    assert rules == set(DELIBERATE), set(DELIBERATE) - rules
