"""NVLink inside a node: NVSwitch gives every group a GPU's full figure; the HPC sites' 4-GPU nodes
(GH200 on JUPITER, JEDI, Alps; A100 on JUWELS Booster, JURECA-DC, Leonardo) link each GPU pair
directly, so a group of g GPUs drives g - 1 pair links (Cluster.nvlink). The step-time model and
the topology warning price every group through that one function."""

from __future__ import annotations

import pytest

from config.cost.collectives import ring
from config.cost.constants import VALUES
from config.cost.steptime import layer_costs, predict
from config.hardware import MESH, SWITCH, Cluster
from config.rules import derive
from config.tree import ConfigError
from launchers.jobsize import JobSize, job_cluster
from launchers.profile import from_toml, load_profile
from recipes.advice.check import check
from recipes.registry import get, resolve

ONE_LAYOUT = ["parallel.pipeline_model_parallel_size=1", "parallel.context_parallel_size=1"]


def tp_seconds(tp: int, cluster: Cluster) -> float:
    """Llama 3 8B's TP collectives per layer and microbatch, TP inside one node of `cluster`."""
    _, cfg = resolve(
        "llama3_8b_pretrain", [f"parallel.tensor_model_parallel_size={tp}", *ONE_LAYOUT]
    )
    return layer_costs(cfg, cluster, derive(cfg, cluster)).dense["tp"]


def test_a_mesh_gives_a_group_its_pair_links_and_a_switch_everything() -> None:
    gh200, a100_4, a100_8 = Cluster(4, 4, "gh200"), Cluster(4, 4, "a100-64g"), Cluster(2, 8, "a100")
    assert (gh200.topology, a100_4.topology, a100_8.topology) == (MESH, MESH, SWITCH)
    assert [gh200.nvlink(g) for g in (2, 3, 4)] == [150, 300, 450]
    assert [a100_4.nvlink(g) for g in (2, 3, 4)] == [100, 200, 300]
    # A group larger than the mesh (a TP group that spans nodes) never gets more than the GPU has.
    assert gh200.nvlink(8) == 450
    # DGX A100 (8 GPUs on NVSwitch): the full 300 for a pair as for all 8.
    assert [a100_8.nvlink(g) for g in (2, 4, 8)] == [300, 300, 300]


@pytest.mark.parametrize(
    "cluster",
    [
        Cluster(8, 8, "h100"),
        Cluster(8, 8, "h200"),
        Cluster(8, 8, "b200"),
        Cluster(18, 4, "gb200"),  # NVL72: 4 GPUs per tray, one switch fabric for 72
        Cluster(8, 4, "h100"),  # no pair figure: an H100 node is an NVSwitch board
    ],
)
def test_nvswitch_gives_any_group_the_kinds_full_figure(cluster: Cluster) -> None:
    assert cluster.topology == SWITCH
    assert {cluster.nvlink(g) for g in (2, 3, 4, 8)} == {cluster.spec.nvlink_gb_s}


def test_tp2_against_tp4_on_gh200_as_the_mesh_implies() -> None:
    """Per layer, TP moves (t-1)/t of its bytes at the group's bandwidth: on NVSwitch TP 2 moves
    2/3 of TP 4's time (1/2 against 3/4 at 450 GB/s); on GH200's mesh TP 2 has one pair link
    (150) against TP 4's three (450), so it takes twice TP 4's time."""
    mesh = Cluster(4, 4, "gh200")
    switched = Cluster(4, 4, "gh200", nvlink_topology=SWITCH)
    assert tp_seconds(2, mesh) / tp_seconds(4, mesh) == pytest.approx(2.0)
    assert tp_seconds(2, switched) / tp_seconds(4, switched) == pytest.approx(2 / 3)
    assert tp_seconds(2, mesh) == pytest.approx(3 * tp_seconds(2, switched))
    assert tp_seconds(4, mesh) == pytest.approx(tp_seconds(4, switched))
    # The same on DGX H100, for any group: the figure of one per kind.
    dgx = Cluster(2, 8, "h100")
    assert tp_seconds(2, dgx) / tp_seconds(4, dgx) == pytest.approx(2 / 3)
    assert tp_seconds(8, dgx) / tp_seconds(4, dgx) == pytest.approx((7 / 8) / (3 / 4))


def test_the_whole_step_on_dgx_h100_is_the_same_whatever_the_topology_default() -> None:
    """DGX H100 resolves to NVSwitch with or without the profile's word: every term is equal."""
    cfg = get("llama3_70b_pretrain").config()
    plain = Cluster(8, 8, "h100")
    said = job_cluster(None, load_profile("dgx-h100"), JobSize(nodes=8))
    assert said.nvlink_topology == SWITCH
    a, b = (predict(cfg, c, derive(cfg, c)) for c in (plain, said))
    assert a is not None and b is not None and a.terms == b.terms


def test_site_profiles_say_mesh_and_another_gpu_kind_brings_its_own_board() -> None:
    for site, pair in (("jupiter", 150), ("alps", 150), ("leonardo", 100), ("juwels-booster", 100)):
        cluster = job_cluster(None, load_profile(site), JobSize(nodes=2))
        assert (cluster.topology, cluster.nvlink(2), cluster.nvlink(4)) == (MESH, pair, 3 * pair)
    other = job_cluster(None, load_profile("jupiter"), JobSize(nodes=2, gpu="h200"))
    assert other.nvlink_topology is None and other.topology == SWITCH


def test_the_topology_warning_names_the_groups_nvlink_figure() -> None:
    """TP x CP = 4 x 2 over JUPITER's 4-GPU nodes: the CP ring sends to one peer, over one pair
    link (150 GB/s, 6x the network's 25); the expert all-to-all of EP 16 reaches 3 peers in the
    node over their links (450, 18x); on H100 nodes of 4 the warning keeps NVSwitch's 450."""
    jupiter = job_cluster(None, load_profile("jupiter"), JobSize(nodes=4))
    _, cfg = resolve(
        "llama3_8b_pretrain",
        ["parallel.tensor_model_parallel_size=4", "parallel.context_parallel_size=2"],
    )
    (cp,) = check(cfg, jupiter).warnings
    assert "NVLink's 150 (1 pair link per GPU, no NVSwitch), 6x less" in cp.message, cp.message
    _, moe = resolve("qwen3_30b_a3b_pretrain", [])
    (ep,) = [w for w in check(moe, jupiter).warnings if "expert" in w.field]
    assert "NVLink's 450 (3 pair links per GPU, no NVSwitch), 18x less" in ep.message, ep.message
    (dgx,) = [w for w in check(moe, Cluster(4, 4, "h100")).warnings if "expert" in w.field]
    assert "NVLink's 450, 9x less" in dgx.message, dgx.message


def test_an_unknown_topology_is_refused_by_the_profile_and_the_checker() -> None:
    base = {"executor": "slurm-apptainer", "container_image": "/x/img.sif"}
    with pytest.raises(ConfigError) as err:
        from_toml(base | {"nvlink_topology": "ring"})
    assert [key for key, _ in err.value.problems] == ["nvlink_topology"]
    assert "switch, mesh" in err.value.problems[0][1]
    _, cfg = resolve("llama3_8b_pretrain", [])
    report = check(cfg, Cluster(2, 4, "gh200", nvlink_topology="ring"))
    assert not report.valid and "cluster.nvlink_topology" in [p.field for p in report.problems]


def test_a_data_parallel_ring_leaves_a_domain_through_all_its_members_nics() -> None:
    """NCCL lays one ring channel per NIC, so a ring that spans nodes leaves each through the NICs
    of all its members there. Oracle: nccl-tests' all-reduce bus bandwidth across DGX H100 nodes
    (8 NICs of 400 Gb/s), ~360-400 GB/s, NVLink-class, not one NIC's 45."""
    k = VALUES
    dgx = Cluster(4, 8, "h100")
    rate = ring(dgx, 32, 1, k) / 1e9  # TP 1: all 8 GPUs of each node in the ring
    assert 340 <= rate <= 420
    assert ring(dgx, 16, 2, k) == pytest.approx(ring(dgx, 32, 1, k) / 2)  # TP 2: 4 members a node
    assert ring(dgx, 4, 8, k) / 1e9 == pytest.approx(50 * k["network"])  # TP 8: one NIC
    assert ring(dgx, 8, 1, k) / 1e9 == pytest.approx(450 * k["nvlink"])  # inside one node
    # GB200 NVL72, 128 GPUs: a data-parallel group of 64 (TP 2) has 32+ members in each rack,
    # so it runs at NVLink's rate, not one NIC's (Llama 3.1 405B with Megatron-FSDP on 128
    # GB200s published 729 tokens/s/GPU; a one-NIC ring priced it at 148).
    nvl72 = Cluster(32, 4, "gb200")
    assert ring(nvl72, 64, 2, k) == pytest.approx(900e9 * k["nvlink"])
    _, cfg = resolve(
        "llama31_405b_pretrain",
        ["parallel.tensor_model_parallel_size=2", "parallel.pipeline_model_parallel_size=1",
         "parallel.virtual_pipeline_model_parallel_size=null", "parallel.use_megatron_fsdp=true",
         "train.global_batch_size=64", "train.micro_batch_size=1",
         "precision=bf16_with_fp8_current_scaling_mixed"],
    )  # fmt: skip
    step = predict(cfg, nvl72, derive(cfg, nvl72))
    assert step is not None and step.terms["dp"] < 0.25 * step.seconds


def test_tp_and_cp_all_gather_rings_across_4_gpu_nodes_use_every_members_nic() -> None:
    """TP 8 on 4-GPU nodes (JSC's GPT 175B benchmark on JUWELS Booster ran so) and CP's all-gather
    across them are rings as the data-parallel ones are: each node's 4 members move them at 4
    NICs' rate (25 GB/s each on JUWELS Booster), not at one NIC's. TP 4 stays on the mesh."""
    booster = Cluster(2, 4, "a100-40g")
    nic = booster.network * 1e9 * VALUES["network"]
    assert ring(booster, 8, 1, VALUES) == pytest.approx(4 * nic)
    seconds = {}
    for t in (8, 4):
        _, cfg = resolve(
            "llama3_8b_pretrain",
            [f"parallel.tensor_model_parallel_size={t}", "parallel.context_parallel_size=1",
             "parallel.pipeline_model_parallel_size=1", "parallel.sequence_parallel=true"],
        )  # fmt: skip
        seconds[t] = layer_costs(cfg, booster, derive(cfg, booster)).dense["tp"]
    # 7/8 of the bytes at 4 NICs against 3/4 of them at 3 pair links of 100 GB/s
    ratio = (7 / 8 / (4 * nic)) / (3 / 4 / (booster.nvlink(4) * 1e9 * VALUES["nvlink"]))
    assert seconds[8] / seconds[4] == pytest.approx(ratio)
    _, cp = resolve(
        "llama3_8b_pretrain",
        ["parallel.tensor_model_parallel_size=1", "parallel.context_parallel_size=8",
         "parallel.cp_comm_type=all_gather", "parallel.pipeline_model_parallel_size=1"],
    )  # fmt: skip
    m = cp.model
    tokens = m.seq_length * cp.train.micro_batch_size / 8
    head = m.hidden_size // m.num_attention_heads
    kv_bytes = tokens * 2 * m.num_query_groups * head * 2  # a rank's K and V, BF16
    # gathered forward and backward, the gradients reduce-scattered: 3 x 7 shards at 4 NICs
    gather = layer_costs(cp, booster, derive(cp, booster)).dense["cp"]
    assert gather == pytest.approx(3 * 7 * kv_bytes / (4 * nic))
