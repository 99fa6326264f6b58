"""The MoE token exchange in the step-time model and the planner: the flex dispatcher's one send
per remote node and per GPU (held against Megatron-Core's own router), the alltoall overlap
(parallel.overlap_moe_expert_parallel_comm) in the model, the memory estimate, the planner and the
process environment. Its checker rules are held against Megatron-Core in test_rules_moe_oracle.py."""

from __future__ import annotations

import pytest

from config.cost import layers
from config.cost import steptime as perf
from config.cost.constants import KERNELS_PER_LAYER
from config.cost.memory import estimate_memory
from config.finalize import finalize
from config.hardware import Cluster
from config.rules import derive, validate
from launchers.env import recipe_env
from recipes.advice.plan import plan
from recipes.registry import resolve

A2A = "parallel.overlap_moe_expert_parallel_comm=true"
FLEX = "model.moe_token_dispatcher_type=flex"
DSV3 = "deepseek_v3_pretrain_1024gpu_h100_fp8sc"
CLUSTER_1024 = Cluster(num_nodes=128, gpus_per_node=8, gpu="h100")

# (experts, top-k, groups, groups picked, NVLink domains of the EP group): DeepSeek-V3's
# node-limited routing at EP 32, 64, 128 and 256 over 8-GPU nodes; Qwen3 30B-A3B and Mixtral-like
# routing without groups.
ROUTINGS = [
    (256, 8, 8, 4, 4),
    (256, 8, 8, 4, 8),
    (256, 8, 8, 4, 16),
    (256, 8, 8, 4, 32),
    (128, 8, 1, 1, 2),
    (128, 8, 1, 1, 4),
    (64, 6, 1, 1, 8),
    (128, 8, 1, 1, 8),  # Qwen3 30B-A3B's ranks at EP 8: a "domain" of one GPU
]


@pytest.mark.parametrize("routing", ROUTINGS)
def test_remote_domains_match_megatron_cores_router(routing: tuple[int, ...]) -> None:
    """Megatron-Core's own top-k (group-limited where groups are set) on random scores, which is
    how moe_router_force_load_balancing routes the published runs: the remote domains per token
    agree with the closed form within 3%."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.moe.moe_utils import group_limited_topk

    experts, topk, groups, picked, domains = routing
    tokens = 20_000
    generator = torch.Generator().manual_seed(0)
    scores = torch.rand(tokens, experts, generator=generator)
    if groups > 1:
        _, chosen = group_limited_topk(scores, topk, tokens, experts, groups, picked)
    else:
        chosen = scores.topk(topk, dim=-1)[1]
    touched = torch.zeros(tokens, domains).scatter_(1, chosen // (experts // domains), 1.0)
    own = torch.randint(0, domains, (tokens, 1), generator=generator)
    measured = touched.scatter_(1, own, 0.0).sum(1).mean().item()
    assert layers.remote_domains(*routing) == pytest.approx(measured, rel=0.03)


def _ep_seconds(overrides: list[str], cluster: Cluster = CLUSTER_1024) -> float:
    _, cfg = resolve(DSV3, overrides)
    return perf.layer_costs(cfg, cluster, derive(cfg, cluster)).moe["ep"]


def test_flex_sends_a_token_once_per_remote_node() -> None:
    """EP 64 over 8 nodes with node-limited routing (4 of 8 groups, a group per node): the flex
    dispatcher sends ~3.5 copies of a token over the network, the alltoall one 8 x 7/8 = 7."""
    alltoall, flex = _ep_seconds([]), _ep_seconds([FLEX])
    assert flex == pytest.approx(alltoall * 3.5 / 7, rel=0.02)
    # Inside one node the alltoall sends a token's 8 copies to 7/8 x 8 other GPUs; the flex
    # dispatcher sends it once to each GPU holding one of its experts (DeepEP's is_token_in_rank):
    # 4 groups picked of 8, a group per GPU, 4 x 7/8 = 3.5 others.
    one_node = Cluster(num_nodes=1, gpus_per_node=8, gpu="h100")
    inside = [
        "parallel.expert_model_parallel_size=8",
        "parallel.tensor_model_parallel_size=1",
        "parallel.sequence_parallel=false",
        "parallel.pipeline_model_parallel_size=1",
        "parallel.virtual_pipeline_model_parallel_size=null",
        "train.global_batch_size=8",
    ]
    once = layers.remote_domains(256, 8, 8, 4, 8) / 7
    assert once == pytest.approx(0.5)
    assert _ep_seconds([*inside, FLEX], one_node) == pytest.approx(
        _ep_seconds(inside, one_node) * once
    )


@pytest.mark.parametrize("ep", [8, 16, 32, 64, 128])
def test_each_local_expert_launches_its_own_gemms(ep: int) -> None:
    """Transformer Engine's grouped GEMM is a cuBLAS GEMM per local expert (six a layer, forward
    and backward), each at the price of one of the dense layer's launches: DeepSeek-V3's 256
    experts at EP 8 (32 a GPU) launch 192 GEMMs a layer, at EP 128 twelve."""
    _, cfg = resolve(DSV3, [f"parallel.expert_model_parallel_size={ep}", FLEX])
    costs = perf.layer_costs(cfg, CLUSTER_1024, derive(cfg, CLUSTER_1024))
    launch = perf.VALUES["layer_overhead_s"] / KERNELS_PER_LAYER
    extra = costs.moe["overhead"] - costs.dense["overhead"]
    assert extra == pytest.approx(6 * 256 // ep * launch)  # the fused MLP's one kernel: in
    # test_fused_grouped_mlp.py, on Blackwell


ALLTOALL = "model.moe_token_dispatcher_type=alltoall"
PADDED = ["model.moe_expert_capacity_factor=1.0", "model.moe_pad_expert_input_to_capacity=true"]


@pytest.mark.parametrize("ep", [8, 32, 128])
def test_the_dropless_alltoall_waits_on_the_host_for_each_local_expert(ep: int) -> None:
    """Megatron-Core's dropless alltoall dispatcher waits on the host for the token counts before
    its exchange, and the GPU then waits on the host for each local expert's work
    (alltoall_sync_s). Padded token dropping never waits (the host knows its shapes); the flex
    dispatcher is not priced so, as NVIDIA's runs lost nothing going dropless on it."""

    def overhead(extra: list[str]) -> float:
        _, cfg = resolve(DSV3, [f"parallel.expert_model_parallel_size={ep}", *extra])
        return perf.layer_costs(cfg, CLUSTER_1024, derive(cfg, CLUSTER_1024)).moe["overhead"]

    waits = overhead([ALLTOALL]) - overhead([FLEX])
    assert waits == pytest.approx(perf.VALUES["alltoall_sync_s"] * (256 // ep))
    assert overhead([ALLTOALL, *PADDED]) == pytest.approx(overhead([FLEX]))


def test_the_overlap_hides_the_alltoall_behind_compute() -> None:
    """What stays exposed is the contention share of what overlaps, while the compute of the
    other microbatch is longer than the exchange (it is at EP 64 with DeepEP)."""
    exposed, overlapped = _ep_seconds([FLEX]), _ep_seconds([FLEX, A2A])
    assert overlapped == pytest.approx(exposed * perf.VALUES["overlap_contention"])
    _, cfg = resolve(DSV3, [FLEX])
    _, hidden = resolve(DSV3, [FLEX, A2A])
    slow = perf.predict(cfg, CLUSTER_1024, derive(cfg, CLUSTER_1024))
    fast = perf.predict(hidden, CLUSTER_1024, derive(hidden, CLUSTER_1024))
    assert fast.terms["ep"] < slow.terms["ep"] / 4
    assert fast.tokens_per_s_per_gpu > slow.tokens_per_s_per_gpu


def test_the_shared_experts_hide_what_they_compute_of_the_exchange() -> None:
    """model.moe_shared_expert_overlap: the shared experts' forward and backward run beside the
    same microbatch's dispatch and combine, so the exchange shrinks by their time (the GEMM time
    a model without shared experts lacks), less the contention share, and never below zero."""
    shared = "model.moe_shared_expert_overlap=true"

    def moe_costs(*overrides: str) -> dict[str, float]:
        _, cfg = resolve(DSV3, [FLEX, *overrides])
        return perf.layer_costs(cfg, CLUSTER_1024, derive(cfg, CLUSTER_1024)).moe

    plain, overlapped = moe_costs(), moe_costs(shared)
    shared_s = plain["gemm"] - moe_costs("model.moe_shared_expert_intermediate_size=null")["gemm"]
    assert 0 < shared_s < plain["ep"]  # DeepSeek-V3 at EP 64: the exchange outlasts them
    assert overlapped["gemm"] == plain["gemm"]  # the same work, on another stream
    contention = perf.VALUES["overlap_contention"]
    assert overlapped["ep"] == pytest.approx(plain["ep"] - (1 - contention) * shared_s)
    # With the alltoall overlap too, Megatron-Core refuses the pair, and `check` says so.
    _, both = resolve(DSV3, [FLEX, shared, A2A])
    problems = validate(both, CLUSTER_1024, finalize(both, CLUSTER_1024))
    assert any("moe_shared_expert_overlap" in p.message for p in problems)


def test_the_first_forward_and_the_last_backward_stay_exposed() -> None:
    """At PP 1 the combined schedule pairs every microbatch's exchange but the first forward's
    and the last backward's: one microbatch's worth, on every MoE layer."""
    cluster = Cluster(num_nodes=2, gpus_per_node=8, gpu="h100")
    _, cfg = resolve("qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs", [FLEX, A2A])
    derived = derive(cfg, cluster)
    costs = perf.layer_costs(cfg, cluster, derived)
    step = perf.predict(cfg, cluster, derived)
    layers, microbatches = cfg.model.num_layers, derived.num_microbatches
    paired = microbatches * costs.moe["ep"]
    assert costs.ep_unpaired > 0
    assert step.terms["ep"] == pytest.approx(layers * (paired + costs.ep_unpaired))


def test_the_overlap_holds_one_layer_more_at_pp1_and_one_chunk_more_interleaved() -> None:
    """Megatron-Core's combined 1F1B without a pipeline (combined_1f1b.py) pairs layer i's forward
    of the next microbatch with the backward of the last layer left of the previous one, and
    frees that layer's state (model_chunk_schedule_plan.py): the two hold one microbatch's layers
    plus the pair's, not two microbatches. The interleaved schedule adds one warm-up microbatch
    (schedules.py): one model chunk more."""
    cluster = Cluster(num_nodes=2, gpus_per_node=8, gpu="h100")
    name = "qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs"
    flat = ["parallel.pipeline_model_parallel_size=1",
            "parallel.virtual_pipeline_model_parallel_size=null"]  # fmt: skip
    _, cfg = resolve(name, flat)
    _, ahead = resolve(name, [*flat, A2A])
    one = estimate_memory(cfg, cluster, derive(cfg, cluster))
    two = estimate_memory(ahead, cluster, derive(ahead, cluster))
    assert (one.microbatches_in_flight, two.microbatches_in_flight) == (1, 1)
    layer = one.activations_gib / cfg.model.num_layers  # every layer of Qwen3 30B-A3B is MoE
    assert two.activations_gib == pytest.approx(one.activations_gib + layer)
    staged = ["parallel.pipeline_model_parallel_size=2",
              "parallel.virtual_pipeline_model_parallel_size=12",
              "parallel.expert_model_parallel_size=8"]  # fmt: skip
    _, cfg = resolve(name, staged)
    _, ahead = resolve(name, [*staged, A2A])
    one = estimate_memory(cfg, cluster, derive(cfg, cluster))
    two = estimate_memory(ahead, cluster, derive(ahead, cluster))
    assert two.microbatches_in_flight == pytest.approx(one.microbatches_in_flight + 1 / 12)


def test_the_planner_keeps_the_overlap_where_megatron_core_runs_it() -> None:
    """Asked for, the overlap stays on in every plan that can have it (PP 1, or virtual stages;
    no full recompute) and goes off in the others; every plan passes the checker as written."""
    cluster = Cluster(num_nodes=2, gpus_per_node=8, gpu="h100")
    name, overrides = "qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs", [FLEX, A2A]
    _, cfg = resolve(name, overrides)
    plans, _ = plan(cfg, cluster, top=100)
    states = set()
    for p in plans:
        fields = dict(o.split("=", 1) for o in p.overrides)
        can = (p.shape.pp == 1 or p.shape.vpp is not None) and p.shape.ep > 1
        can = can and fields["model.recompute_granularity"] != "full"
        assert fields["parallel.overlap_moe_expert_parallel_comm"] == str(can).lower(), p.overrides
        _, planned = resolve(name, [*overrides, *p.overrides])
        assert validate(planned, cluster) == []
        states.add(can)
    assert states == {True, False}  # the sample has plans of both kinds


def test_pinned_off_it_stays_off() -> None:
    cluster = Cluster(num_nodes=2, gpus_per_node=8, gpu="h100")
    _, cfg = resolve("qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs", [FLEX])
    plans, _ = plan(cfg, cluster, top=10)
    assert all("parallel.overlap_moe_expert_parallel_comm=false" in p.overrides for p in plans)


def test_a_layout_without_virtual_stages_is_refused_with_the_fix() -> None:
    _, cfg = resolve(DSV3, [A2A, "parallel.virtual_pipeline_model_parallel_size=null"])
    (problem,) = [p for p in validate(cfg, CLUSTER_1024) if "overlap" in p.field]
    assert problem.field == "parallel.overlap_moe_expert_parallel_comm"
    assert "PP=8" in problem.message
    assert "parallel.virtual_pipeline_model_parallel_size" in problem.message


def test_hardware_queues_for_the_overlap() -> None:
    """Without TP or CP the overlap gets 32 hardware queues (Megatron-Bridge's Qwen3 H100 runs);
    with TP the single queue that TP's overlap needs wins (its DeepSeek-V3 H100 runs)."""
    env = {v.name: v.value for v in recipe_env(resolve(DSV3, [A2A])[1])}
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    qwen = resolve("qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs", [A2A])[1]
    assert {v.name: v.value for v in recipe_env(qwen)}["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    plain = resolve("qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs", [])[1]
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in {v.name for v in recipe_env(plain)}


def test_the_combined_schedule_gets_the_models_schedule_plan() -> None:
    """Megatron-Core's combined 1F1B schedule calls the forward step with
    return_schedule_plan=True and runs what GPTModel.build_schedule_plan returns; every other
    schedule calls the model. Both get the same inputs."""
    torch = pytest.importorskip("torch")
    from models.gpt import forward
    from training.step import forward_step

    class Model:
        def __init__(self) -> None:
            self.calls: list[tuple[str, tuple, dict]] = []

        def __call__(self, *args, **kwargs) -> str:
            self.calls.append(("forward", args, kwargs))
            return "output"

        def build_schedule_plan(self, *args, **kwargs) -> str:
            self.calls.append(("plan", args, kwargs))
            return "plan"

    batch = {
        "tokens": torch.zeros(1, 4, dtype=torch.long),
        "position_ids": torch.arange(4)[None],
        "labels": torch.ones(1, 4, dtype=torch.long),
        "loss_mask": torch.ones(1, 4),
    }
    model = Model()
    assert forward_step(forward, iter([batch]), model)[0] == "output"
    assert forward_step(forward, iter([batch]), model, return_schedule_plan=True)[0] == "plan"
    (kind_a, args_a, kwargs_a), (kind_b, args_b, kwargs_b) = model.calls
    assert (kind_a, kind_b) == ("forward", "plan")
    assert args_a[0] is args_b[0] is batch["tokens"] and args_a[2] is args_b[2] is None
    assert kwargs_a["labels"] is kwargs_b["labels"] is batch["labels"]
