"""The checker's rules: a table of broken configs, each rejected with the right dotted field."""

from __future__ import annotations

import pytest

from config.finalize import finalize
from config.hardware import Cluster
from config.rules import validate
from config.schema import ModelConfig, ParallelConfig, TrainConfig, TrainingConfig
from config.tree import ConfigError, apply_overrides, get_path


def llama_like() -> TrainingConfig:
    """A Llama-3-8B-shaped config on 8 H100s (TP 2, DP 4) that passes every rule."""
    return TrainingConfig(
        name="llama_like",
        model=ModelConfig(
            num_layers=32,
            hidden_size=4096,
            ffn_hidden_size=14336,
            num_attention_heads=32,
            num_query_groups=8,
            seq_length=8192,
            vocab_size=128256,
        ),
        train=TrainConfig(global_batch_size=128, max_steps=10_000),
        parallel=ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True),
    )


def moe_like() -> TrainingConfig:
    cfg = llama_like()
    apply_overrides(
        cfg,
        [
            "model.num_moe_experts=8",
            "model.moe_router_topk=2",
            "parallel.expert_model_parallel_size=4",
        ],
    )
    return cfg


H100x8 = Cluster(num_nodes=1, gpus_per_node=8, gpu="h100")


def fields(cfg: TrainingConfig, cluster: Cluster = H100x8) -> set[str]:
    return {p.field for p in validate(cfg, cluster)}


def test_baselines_are_valid() -> None:
    assert fields(llama_like()) == set()
    assert fields(moe_like()) == set()


# (overrides, cluster or None for 8 x H100, the field that must be named)
INVALID = [
    (["parallel.context_parallel_size=3"], None, "parallel.context_parallel_size"),
    (["parallel.tensor_model_parallel_size=3"], None, "parallel.tensor_model_parallel_size"),
    (
        [
            "parallel.tensor_model_parallel_size=16",
            "model.num_query_groups=8",
            "model.seq_length=8190",
        ],
        Cluster(num_nodes=2, gpus_per_node=8),
        "model.seq_length",  # TP 16 over 8 KV groups replicates them (Megatron-Core runs it)
    ),
    (
        ["parallel.pipeline_model_parallel_size=3"],
        Cluster(num_nodes=3, gpus_per_node=8),
        "parallel.pipeline_model_parallel_size",
    ),
    (
        ["parallel.pipeline_model_parallel_size=5"],
        Cluster(num_nodes=5, gpus_per_node=8),
        "parallel.pipeline_model_parallel_size",
    ),
    (
        [
            "parallel.pipeline_model_parallel_size=2",
            "parallel.virtual_pipeline_model_parallel_size=3",
        ],
        None,
        "parallel.virtual_pipeline_model_parallel_size",
    ),
    (
        ["parallel.virtual_pipeline_model_parallel_size=2"],
        None,
        "parallel.virtual_pipeline_model_parallel_size",
    ),
    (
        [
            "parallel.pipeline_model_parallel_size=2",
            "parallel.pipeline_model_parallel_layout=Et|tL",
        ],
        None,
        "parallel.pipeline_model_parallel_layout",
    ),
    (
        [
            "parallel.pipeline_model_parallel_size=2",
            "parallel.pipeline_model_parallel_layout=(tttttttt|)*4tL",
        ],
        None,
        "parallel.pipeline_model_parallel_layout",
    ),
    (
        ["parallel.pipeline_model_parallel_size=2", "parallel.pipeline_model_parallel_layout=Ex|L"],
        None,
        "parallel.pipeline_model_parallel_layout",
    ),
    (
        ["parallel.tensor_model_parallel_size=1", "parallel.sequence_parallel=true"],
        None,
        "parallel.sequence_parallel",
    ),
    (
        ["parallel.context_parallel_size=2", "model.seq_length=8190"],
        None,
        "parallel.context_parallel_size",
    ),
    (["model.seq_length=8191"], None, "model.seq_length"),
    (["train.global_batch_size=126"], None, "train.global_batch_size"),
    (["train.micro_batch_size=3"], None, "train.global_batch_size"),
    (
        [
            "parallel.pipeline_model_parallel_size=2",
            "parallel.virtual_pipeline_model_parallel_size=2",
            "parallel.tensor_model_parallel_size=1",
            "parallel.sequence_parallel=false",
            "train.global_batch_size=12",
        ],
        None,
        "train.global_batch_size",
    ),
    (["model.num_query_groups=6"], None, "model.num_query_groups"),
    # RoPE needs an even head dimension: 4128 / 32 heads = 129.
    (["model.hidden_size=4128", "model.ffn_hidden_size=14336"], None, "model.hidden_size"),
    (["model.kv_channels=65"], None, "model.kv_channels"),
    (["model.num_attention_heads=30"], None, "model.num_attention_heads"),
    (["model.ffn_hidden_size=14337"], None, "parallel.tensor_model_parallel_size"),
    (["parallel.expert_model_parallel_size=2"], None, "parallel.expert_model_parallel_size"),
    # A dense model too: Megatron-Core lays out the expert groups at start-up all the same.
    (["parallel.expert_tensor_parallel_size=16"], None, "parallel.expert_tensor_parallel_size"),
    (["precision=bf16_with_fp8_current_scaling_mixed"], Cluster(gpu="a100"), "precision"),
    (["precision=bf16_with_mxfp8_mixed"], None, "precision"),
    (["precision=bf16_with_nvfp4_mixed"], Cluster(gpu="h200"), "precision"),
    (["precision=bf16_with_fp8_subchannel_scaling_mixed"], Cluster(gpu="a100-40g"), "precision"),
    (["precision=bf16_with_fp8_current_scaling_mixed"], Cluster(gpu="a100-64g"), "precision"),
    (["precision=bf16_with_mxfp8_mixed"], Cluster(gpu="gh200"), "precision"),
    (["precision=bf16_with_mxfp8_mixed"], Cluster(gpu="gh200-144g"), "precision"),
    (["model.recompute_granularity=full"], None, "model.recompute_method"),
    (["optimizer.min_lr=1.0"], None, "optimizer.min_lr"),
    (["optimizer.optimizer=sgd"], None, "optimizer.use_distributed_optimizer"),
    (["scheduler.warmup_steps=10000"], None, "scheduler.warmup_steps"),
    (["scheduler.decay_style=wsd"], None, "scheduler.wsd_decay_steps"),
    (["data.kind=indexed"], None, "data.path"),
    (["data.kind=indexed", "data.path=/data/x"], None, "data.tokenizer"),
    (["data.sequence_packing=true"], None, "data.sequence_packing"),
    (["data.split=90,x,1"], None, "data.split"),
    (["data.split=1,2,3,4"], None, "data.split"),
    (
        [
            "data.kind=indexed",
            "data.path=/d/web",
            "data.tokenizer=/t.json",
            "data.split=1,0,0",
            "train.eval_interval=100",
        ],
        None,
        "data.split",
    ),
    (["data.kind=sft", "data.tokenizer=/t.json"], None, "data.path"),
    (["data.kind=indexed", "data.path=0.5 /d/a 0.5", "data.tokenizer=/t.json"], None, "data.path"),
    (["data.kind=sft", "data.path=/data/x.jsonl"], None, "data.tokenizer"),
    (
        [
            "data.kind=sft",
            "data.path=/data/x.jsonl",
            "data.tokenizer=/t.json",
            "data.sequence_packing=true",
            "parallel.context_parallel_size=2",
        ],
        None,
        "data.sequence_packing",
    ),
    (
        ["parallel.context_parallel_size=2"],
        Cluster(gpu="cpu", gpus_per_node=8),
        "parallel.context_parallel_size",
    ),
    # Sequence parallel runs on the CPU (training/cpu_mode.py); FP8 does not.
    (
        ["precision=bf16_with_fp8_current_scaling_mixed"],
        Cluster(gpu="cpu", gpus_per_node=8),
        "precision",
    ),
    ([], Cluster(gpu="tpu"), "cluster.gpu"),
    ([], Cluster(gpu="mi250x", gpus_per_node=4), "cluster.gpu"),
    ([], Cluster(num_nodes=0), "cluster"),
    # The run directory is <run_root>/<name>-<time>: a name may not lead out of run_root.
    (["name=../x"], None, "name"),
    (["name=/abs/x"], None, "name"),
    (["name=.hidden"], None, "name"),
]


@pytest.mark.parametrize(
    ("overrides", "cluster", "field"), INVALID, ids=[" ".join(o) or f for o, _, f in INVALID]
)
def test_invalid_config_names_the_field(
    overrides: list[str], cluster: Cluster | None, field: str
) -> None:
    cfg = llama_like()
    apply_overrides(cfg, overrides)
    problems = validate(cfg, cluster or H100x8)
    assert field in {p.field for p in problems}, problems
    named = next(p for p in problems if p.field == field)
    assert len(named.message) > 20  # says what is wrong and how to fix it


# A value outside a field's choices: refused by the override itself, with the closest valid one;
# set in Python (where no parser looks), the checker names it the same way.
BAD_CHOICES = [
    ("precision", "bf17_mixed", "bf16_mixed"),
    ("model.normalization", "RMSnorm", "RMSNorm"),
    ("model.activation", "relu6", "gelu"),
    ("model.moe_token_dispatcher_type", "all2all", "alltoall"),
    ("model.moe_router_score_function", "sigmoids", "sigmoid"),
    ("model.moe_router_load_balancing_type", "aux_los", "aux_loss"),
    ("model.recompute_method", "uniforms", "uniform"),
    ("optimizer.optimizer", "lion", None),
    ("scheduler.decay_style", "cosin", "cosine"),
    ("data.kind", "parquet", None),
    ("data.kind", "indexd", "indexed"),
    ("train.device", "tpu", "cpu"),
    ("logging.wandb_mode", "sometimes", None),
]


@pytest.mark.parametrize(("field", "value", "closest"), BAD_CHOICES)
def test_value_outside_the_choices_names_them(field: str, value: str, closest: str | None) -> None:
    with pytest.raises(ConfigError) as err:
        apply_overrides(llama_like(), [f"{field}={value}"])
    ((named, message),) = err.value.problems
    assert named == field and f"'{value}' is not one of" in message
    assert (f"Did you mean '{closest}'" in message) if closest else ("Did you mean" not in message)
    cfg = llama_like()
    section, _, name = field.rpartition(".")
    object.__setattr__(get_path(cfg, section) if section else cfg, name, value)
    problems = [p for p in validate(cfg, H100x8) if p.field == field]
    assert [p.message for p in problems] == [message]


MOE_INVALID = [
    (["parallel.expert_model_parallel_size=3"], "parallel.expert_model_parallel_size"),
    (
        ["parallel.expert_model_parallel_size=8", "parallel.expert_tensor_parallel_size=2"],
        "parallel.expert_model_parallel_size",
    ),
    (["model.moe_router_topk=9"], "model.moe_router_topk"),
]


@pytest.mark.parametrize(("overrides", "field"), MOE_INVALID)
def test_invalid_moe_config_names_the_field(overrides: list[str], field: str) -> None:
    cfg = moe_like()
    apply_overrides(cfg, overrides)
    assert field in fields(cfg)


def test_world_size_message_shows_the_arithmetic() -> None:
    cfg = llama_like()
    apply_overrides(
        cfg,
        [
            "parallel.tensor_model_parallel_size=1",
            "parallel.sequence_parallel=false",
            "parallel.context_parallel_size=2",
        ],
    )
    problems = validate(cfg, Cluster(num_nodes=1, gpus_per_node=1))
    (problem,) = [p for p in problems if p.field == "parallel.context_parallel_size"]
    assert "world size 1" in problem.message and "1 x 1 x 2 = 2" in problem.message


def test_fp8_on_a100_says_why() -> None:
    cfg = llama_like()
    apply_overrides(cfg, ["precision=bf16_with_fp8_current_scaling_mixed"])
    (problem,) = validate(cfg, Cluster(gpu="a100"))
    assert "A100" in problem.message and "FP8" in problem.message


@pytest.mark.parametrize(
    ("override", "suggestion"),
    [
        ("parallel.tensor_parallel_size=2", "tensor_model_parallel_size"),
        ("train.max_stpes=5", "max_steps"),
        ("optimiser.lr=1e-4", "optimizer"),
        ("model.num_layer=4", "num_layers"),
    ],
)
def test_unknown_field_suggests_the_closest(override: str, suggestion: str) -> None:
    with pytest.raises(ConfigError) as err:
        apply_overrides(llama_like(), [override])
    ((field, message),) = err.value.problems
    assert override.split("=")[0].startswith(field)
    assert suggestion in message


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("train.max_steps=ten", "train.max_steps"),
        ("parallel.sequence_parallel=maybe", "parallel.sequence_parallel"),
        ("model.num_layers=None", "model.num_layers"),
        ("train.max_steps.x=1", "train.max_steps.x"),
        ("train", "train"),
    ],
)
def test_bad_value_names_the_field(override: str, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        apply_overrides(llama_like(), [override])
    assert err.value.problems[0][0] == field


def test_overrides_convert_types_and_none() -> None:
    cfg = apply_overrides(
        llama_like(),
        [
            "parallel.virtual_pipeline_model_parallel_size=None",
            "optimizer.lr=1e-4",
            "parallel.sequence_parallel=False",
            "precision=bf16_with_fp8_current_scaling_mixed",
            "train.max_steps=7.0",
        ],
    )
    assert cfg.parallel.virtual_pipeline_model_parallel_size is None
    assert cfg.optimizer.lr == 1e-4 and isinstance(cfg.optimizer.lr, float)
    assert cfg.parallel.sequence_parallel is False
    assert cfg.precision == "bf16_with_fp8_current_scaling_mixed"
    assert cfg.train.max_steps == 7 and isinstance(cfg.train.max_steps, int)


def test_dataclasses_reject_typos_in_code() -> None:
    cfg = llama_like()
    with pytest.raises(AttributeError):
        cfg.train.max_stpes = 5  # type: ignore[attr-defined]


def test_finalize_derives_after_overrides() -> None:
    cfg = llama_like()
    assert finalize(cfg, H100x8).data_parallel_size == 4
    assert finalize(cfg, H100x8).num_microbatches == 32
    apply_overrides(cfg, ["parallel.tensor_model_parallel_size=4"])
    derived = finalize(cfg, H100x8)
    assert (derived.data_parallel_size, derived.num_microbatches) == (2, 64)


def test_uneven_layers_get_a_balanced_layout() -> None:
    cfg = llama_like()
    apply_overrides(
        cfg,
        [
            "model.num_layers=126",
            "parallel.pipeline_model_parallel_size=8",
            "parallel.virtual_pipeline_model_parallel_size=8",
            "parallel.tensor_model_parallel_size=8",
            "train.global_batch_size=1536",
        ],
    )
    cluster = Cluster(num_nodes=128, gpus_per_node=8)
    derived = finalize(cfg, cluster)
    assert derived.pipeline_layout == "Et|(tt|)*62tL"
    assert sum(derived.decoder_layers_per_rank) == 126
    assert validate(cfg, cluster) == []


def test_text_sft_data_passes_with_a_path_and_a_tokenizer() -> None:
    """data.kind=sft, packed or not, is a valid config once it names its JSONL and tokenizer."""
    cfg = llama_like()
    apply_overrides(cfg, ["data.kind=sft", "data.path=/data/x.jsonl", "data.tokenizer=/t.json"])
    assert validate(cfg, H100x8) == []
    apply_overrides(cfg, ["data.sequence_packing=true"])
    assert validate(cfg, H100x8) == []
