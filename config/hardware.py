"""What each GPU kind has: memory, dense peak throughput, and the number formats it runs.

Peaks are dense (no sparsity) tensor-core figures from NVIDIA's data sheets; MFU is measured against
the peak of the precision the run computes its GEMMs in. Memory is what `torch.cuda.mem_get_info`
reports as total, in GiB, which is a little below the marketing GB figure.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    memory_gib: float
    bf16_tflops: float
    fp8_tflops: float | None = None  # None: no FP8 tensor cores
    fp4_tflops: float | None = None
    fp8_blockwise: bool = False  # 1x128 / 128x128 block scaling (Hopper and later)
    mxfp8: bool = False  # microscaling FP8 and NVFP4 need Blackwell tensor cores
    # GPUs that NVLink joins: None for one node (DGX/HGX boards); 72 for a GB200 NVL72 rack.
    nvlink_domain: int | None = None
    # Per GPU, one direction, GB/s: NVLink inside the domain (all of the GPU's links); the
    # scale-out network beyond it.
    nvlink_gb_s: float = 0.0
    # Boards without NVSwitch link each GPU pair directly (a full mesh): one pair's links, per
    # direction, GB/s. None: the kind comes on NVSwitch boards only. Cluster.nvlink prices a group.
    nvlink_pair_gb_s: float | None = None
    network_gb_s: float = 0.0
    hbm_gb_s: float = 0.0  # memory bandwidth, for the step-time model's memory-bound work
    # Per GPU, one direction, GB/s: the link to its host's memory, which CPU activation
    # offloading (model.cpu_offloading_num_layers) copies over. PCIe x16 on HGX/DGX boards
    # (Gen4 31.5 GB/s for A100, Gen5 63 GB/s for H100, H200 and B200, and for B300 in hosts
    # with Gen5 CPUs); NVLink-C2C on the superchips: 900 GB/s both ways between Grace and its
    # Hopper GPU (GH200, 450 one way), the same 900 shared by the two Blackwell GPUs of a GB200 or
    # GB300 superchip (225 one way each).
    host_gb_s: float = 0.0
    # The node's CPU memory per GPU, GiB: where offloaded activations are pinned. NVIDIA's DGX
    # builds (DGX A100 640 GB, H100, H200, B200, B300: 2 TB for 8 GPUs; DGX A100 320 GB: 1 TB),
    # the superchips' LPDDR5X (GH200: 120 GB per GPU as JUPITER and Alps have it; GB200 and GB300:
    # 480 GB per Grace for its two GPUs), the 4-GPU A100 sites' 512 GB nodes (JUWELS Booster,
    # Leonardo). 0 for the CPU mode: nothing is offloaded there.
    host_memory_gib: float = 0.0
    # Blackwell Ultra (B300, GB300): the data sheets give B200's dense BF16/FP8 peaks at a higher
    # power limit (1,400 W against 1,200 W); the step-time model prices its higher clocks with
    # one fitted factor (config/cost/constants.py blackwell_ultra).
    blackwell_ultra: bool = False


# The HPC sites' 4-GPU nodes. GH200 (JUPITER, JEDI, Alps): the Hopper GPU of a Grace Hopper
# superchip, with H100 SXM's dense peaks and number formats. JUPITER caps a superchip at
# 680 W (GPU and CPU together), so sustained clocks sit below the data sheet's: plan
# against measured rates, not these peaks. Four GH200 share a node without NVSwitch: each
# GPU pair has its own NVLink4 links, 150 GB/s per direction (SITES.md, after JSC's JUPITER
# configuration page: 6 of the GPU's 18 NVLink4 links at 25 GB/s), 3 x 150 = 450 out of each GPU
# (the H100 SXM data sheet's 900 GB/s both ways, halved). A group of 2 GPUs has one pair's
# 150, a group of 4 all three: Cluster.nvlink. Network: 4x NDR200 (Alps: 4x Slingshot
# 200 Gb/s) per node for 4 GPUs, 25 GB/s each.
_GH200 = GpuSpec(
    name="gh200",
    hbm_gb_s=4000,
    # 96 GB HBM3; torch reports 94.88 GiB total on a GH200 96 GB (a CUDA OOM message's
    # "total capacity"; nvidia-smi shows 97,871 MiB), the "~94 GB usable" sites quote.
    memory_gib=94.9,
    bf16_tflops=989.0,
    fp8_tflops=1979.0,
    fp8_blockwise=True,
    nvlink_gb_s=450,
    nvlink_pair_gb_s=150,
    network_gb_s=25,
    host_gb_s=450,
    host_memory_gib=111.8,
)


GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        # Link figures: NVLink 3 / 4 / 5 at 600 / 900 / 1800 GB/s per GPU both ways (NVIDIA's A100,
        # H100 and B200 data sheets), halved for one direction; the network as DGX A100 (one
        # 200 Gb/s HDR NIC per GPU) and DGX H100 / B200 / GB200 (one 400 Gb/s NIC per GPU) build it.
        # HBM bandwidth from the same data sheets (A100 40/80 GB 1.6/2.0 TB/s, H100 SXM 3.35,
        # H200 4.8, B200 and GB200 8 TB/s per GPU). A100 comes on 8-GPU NVSwitch boards (DGX
        # A100) and on 4-GPU boards without a switch (HGX A100 4-GPU: JUWELS Booster, JURECA-DC,
        # Leonardo), where each GPU pair has 4 of the GPU's 12 NVLink3 links, 4 x 25 = 100 GB/s
        # per direction (SITES.md, after JSC's JUWELS Booster overview: NVLink3, all-to-all).
        GpuSpec(
            name="a100-40g",
            hbm_gb_s=1555,
            memory_gib=39.4,
            bf16_tflops=312.0,
            nvlink_gb_s=300,
            nvlink_pair_gb_s=100,
            network_gb_s=25,
            host_gb_s=31.5,
            host_memory_gib=116.4,
        ),
        GpuSpec(
            name="a100",
            hbm_gb_s=2039,
            memory_gib=79.2,
            bf16_tflops=312.0,
            nvlink_gb_s=300,
            nvlink_pair_gb_s=100,
            network_gb_s=25,
            host_gb_s=31.5,
            host_memory_gib=232.8,
        ),
        GpuSpec(
            name="h100",
            hbm_gb_s=3350,
            memory_gib=79.2,
            bf16_tflops=989.0,
            fp8_tflops=1979.0,
            fp8_blockwise=True,
            nvlink_gb_s=450,
            network_gb_s=50,
            host_gb_s=63,
            host_memory_gib=232.8,
        ),
        GpuSpec(
            name="h200",
            hbm_gb_s=4800,
            memory_gib=139.8,
            bf16_tflops=989.0,
            fp8_tflops=1979.0,
            fp8_blockwise=True,
            nvlink_gb_s=450,
            network_gb_s=50,
            host_gb_s=63,
            host_memory_gib=232.8,
        ),
        GpuSpec(
            name="b200",
            hbm_gb_s=8000,
            memory_gib=178.4,
            bf16_tflops=2250.0,
            fp8_tflops=4500.0,
            fp4_tflops=9000.0,
            fp8_blockwise=True,
            mxfp8=True,
            nvlink_gb_s=900,
            network_gb_s=50,
            host_gb_s=63,
            host_memory_gib=232.8,
        ),
        GpuSpec(
            name="gb200",
            hbm_gb_s=8000,
            memory_gib=184.0,
            bf16_tflops=2500.0,
            fp8_tflops=5000.0,
            fp4_tflops=10000.0,
            fp8_blockwise=True,
            mxfp8=True,
            nvlink_domain=72,  # NVL72: 18 trays of 4 GPUs on one NVLink switch fabric
            nvlink_gb_s=900,
            network_gb_s=50,
            host_gb_s=225,
            host_memory_gib=223.5,
        ),
        # Blackwell Ultra. GB300 NVL72 data sheet: per GPU 2.5 PF BF16, 5 PF FP8, 15 PF NVFP4
        # dense (the rack's 360 / 720 PF sparse halved, 1,080 PF dense FP4, over 72 GPUs), 288 GB
        # HBM3e at 8 TB/s, NVLink 5 (1.8 TB/s both ways), one ConnectX-8 (800 Gb/s) per GPU.
        GpuSpec(
            name="gb300",
            blackwell_ultra=True,
            hbm_gb_s=8000,
            memory_gib=268.0,  # 288 GB; not read from torch: an estimate
            bf16_tflops=2500.0,
            fp8_tflops=5000.0,
            fp4_tflops=15000.0,
            fp8_blockwise=True,
            mxfp8=True,
            nvlink_domain=72,
            nvlink_gb_s=900,
            network_gb_s=100,
            host_gb_s=225,
            host_memory_gib=223.5,
        ),
        # HGX B300 data sheet: 8 GPUs, 36 PF BF16 / 72 PF FP8 sparse (2.25 / 4.5 PF dense a GPU),
        # 108 PF dense NVFP4 (13.5 a GPU), 2.1 TB HBM3e (~270 GB a GPU), ConnectX-8 800 Gb/s.
        GpuSpec(
            name="b300",
            blackwell_ultra=True,
            hbm_gb_s=8000,
            memory_gib=250.0,  # ~270 GB; not read from torch: an estimate
            bf16_tflops=2250.0,
            fp8_tflops=4500.0,
            fp4_tflops=13500.0,
            fp8_blockwise=True,
            mxfp8=True,
            nvlink_gb_s=900,
            network_gb_s=100,
            host_gb_s=63,
            host_memory_gib=232.8,
        ),
        # The HPC sites' 4-GPU nodes: GH200 (_GH200 above for its figures), and Leonardo's A100.
        _GH200,
        # 144 GB HBM3e at 4.9 TB/s (NVIDIA's GH200 data sheet), otherwise the gh200 above.
        # Memory: the CUDA driver reports 153,008,209,920 bytes (142.5 GiB) on "NVIDIA GH200 144G
        # HBM3e"; less the ~0.7 GiB torch's total falls short of nvidia-smi on the 96 GB part,
        # ~141.8 GiB. Not measured with torch: an estimate.
        replace(_GH200, name="gh200-144g", hbm_gb_s=4900, memory_gib=141.8),
        # Leonardo's A100 64 GB (custom SXM4, HBM2e): A100 peaks (312 BF16, no FP8). Four per
        # node, NVLink3 between each pair (4 links, 100 GB/s per direction), 300 GB/s out of each
        # GPU as for a100; network 2x dual-port HDR (400 Gb/s per node) for 4 GPUs, 12.5 GB/s
        # each. Memory: 64 GiB less what the driver keeps, as a100's 80 GiB reads 79.2; a CUDA
        # OOM message on a 64 GB A100 reads 63.42 GiB total. HBM bandwidth: four of the 80 GB
        # part's five 16 GB HBM2e stacks, 4/5 of 2039 GB/s (no data sheet for this custom part:
        # an estimate).
        GpuSpec(
            name="a100-64g",
            hbm_gb_s=1631,
            memory_gib=63.4,
            bf16_tflops=312.0,
            nvlink_gb_s=300,
            nvlink_pair_gb_s=100,
            network_gb_s=12.5,
            host_gb_s=31.5,
            host_memory_gib=119.2,
        ),
    )
}
# The CPU smoke mode: no memory limit worth predicting, no peak to compute MFU against.
CPU = GpuSpec(name="cpu", memory_gib=float("inf"), bf16_tflops=0.0)

# How NVLink joins the GPUs of a domain (Cluster.nvlink_topology): through NVSwitch (DGX/HGX
# 8-GPU boards, NVL72's switch trays), or a full mesh of direct pair links (4-GPU boards).
SWITCH, MESH = "switch", "mesh"
NVLINK_TOPOLOGIES = (SWITCH, MESH)


@dataclass(frozen=True, slots=True)
class Cluster:
    """Where a run goes: the job's size and the kind of GPU on every node."""

    num_nodes: int = 1
    gpus_per_node: int = 8
    gpu: str = "h100"
    # GPUs per NVLink domain; None: the GPU kind's (72 for GB200 NVL72), else one node.
    nvlink_domain: int | None = None
    # The scale-out network per GPU, one direction, GB/s; None: the GPU kind's (as NVIDIA's DGX
    # builds it). A site profile sets its own: 12.5 on JURECA-DC and Leonardo, 25 on JUWELS.
    network_gb_s: float | None = None
    # "switch" or "mesh" (NVLINK_TOPOLOGIES); None: what the GPU kind's boards have at this many
    # GPUs per node (Cluster.topology). A site profile says it outright (nvlink_topology).
    nvlink_topology: str | None = None

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def domain(self) -> int:
        """GPUs that reach each other over NVLink: consecutive ranks, as Slurm places them."""
        size = self.nvlink_domain or self.spec.nvlink_domain or self.gpus_per_node
        return max(1, size)

    @property
    def network(self) -> float:
        """GB/s per GPU, one direction, for traffic that leaves the NVLink domain."""
        return self.spec.network_gb_s if self.network_gb_s is None else self.network_gb_s

    @property
    def topology(self) -> str:
        """SWITCH or MESH: the profile's word, else a mesh where the GPU kind has a pair figure
        and the node holds no more GPUs than a full mesh of its links can join (a mesh of n
        GPUs takes n - 1 pair links out of each: 450 / 150 + 1 = 4 GH200, 300 / 100 + 1 = 4
        A100, where an 8-GPU A100 node is a DGX A100 on NVSwitch), and the domain is the node."""
        if self.nvlink_topology is not None:
            return self.nvlink_topology
        spec, pair = self.spec, self.spec.nvlink_pair_gb_s
        largest = spec.nvlink_gb_s / pair + 1 if pair else 0
        meshed = self.gpus_per_node <= largest and self.domain <= self.gpus_per_node
        return MESH if meshed else SWITCH

    def nvlink(self, group: int) -> float:
        """GB/s per GPU, one direction, that a collective among `group` GPUs of one NVLink domain
        moves its bytes at (NCCL's efficiency is the step-time model's: constants.py "nvlink").
        Every price of NVLink traffic asks here: TP, the CP ring and pipeline sends (a send to
        one peer: a group of 2), the expert all-to-all and data-parallel reductions.

        Through NVSwitch every GPU reaches any peer with all its links: the kind's figure for any
        group. In a full mesh a GPU reaches each peer over that pair's links only, so a group of
        g can drive g - 1 of them at once: b x (g - 1) per GPU for pair bandwidth b, up to the
        GPU's total. All-to-all sends each peer its share straight over their link. For ring
        all-reduce and all-gather, NCCL's topology search (src/graph/search.cc, ncclTopoCompute)
        adds ring channels one by one, each taking its bandwidth from every link it crosses
        (followPath), in new GPU orders until the links are spent: on a 4-GPU mesh (4 V100,
        2 NVLinks per pair) its dump shows the rings 0-1-2-3, 0-1-3-2, 0-2-3-1, 0-2-1-3, ...
        (NVIDIA/nccl#713), which together load all three links of each GPU; a ring all-reduce
        moves 2(g - 1)/g of the data through each GPU's links (nccl-tests' PERFORMANCE.md, bus
        bandwidth), as the step-time model's (g - 1)/g / bandwidth prices it. Two GPUs have
        one pair link: NVIDIA/nccl-tests#331 reports ~72 GB/s between two A100 of a Leonardo
        node against the pair's 100, about the 80% of line rate NCCL reaches on any link.
        Without a pair figure a mesh splits the GPU's links evenly among its node's peers."""
        spec = self.spec
        if self.topology == SWITCH:
            return spec.nvlink_gb_s
        pair = spec.nvlink_pair_gb_s or spec.nvlink_gb_s / max(1, self.gpus_per_node - 1)
        return min(spec.nvlink_gb_s, pair * max(1, group - 1))

    def crosses(self, block: int) -> bool:
        """Whether blocks of `block` consecutive ranks (a TP group, a TP x CP group, the ranks
        that hold a strided group) leave their NVLink domain."""
        domain = self.domain
        return block > 1 and self.world_size > domain and (block > domain or domain % block != 0)

    @property
    def spec(self) -> GpuSpec:
        return CPU if self.gpu == "cpu" else GPUS[self.gpu]


# Accelerators people ask for that are not CUDA GPUs: AMD Instinct (MI250X on LUMI, MI300) runs
# ROCm, and neither Transformer Engine's FP8 kernels nor this project's launch and cost model are
# built or checked for it.
_ROCM = re.compile(r"(?<![a-z])mi\d{3}|amd|instinct|radeon|rocm")


def gpu_kind_problem(kind: str) -> str | None:
    """Why `kind` is not a GPU kind this project checks, plans and launches for (None when it is
    one of GPUS, or "cpu"). Every way a kind enters (`--gpu`, a profile's `gpu`, a Cluster, the
    device a rank finds) asks here, so all refuse alike before anything launches."""
    if kind == "cpu" or kind in GPUS:
        return None
    text = (
        f"{kind!r} is not a GPU kind this project knows; known kinds: {', '.join(GPUS)} (or cpu)."
    )
    if _ROCM.search(kind.lower()):
        text += (
            " AMD Instinct GPUs run ROCm, not the CUDA stack (Transformer Engine, NCCL) this "
            "project builds on: run on one of the NVIDIA kinds above."
        )
    else:
        close = difflib.get_close_matches(kind.lower(), list(GPUS), n=3, cutoff=0.6)
        text += f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return text


def gpu_from_device_name(device_name: str) -> str | None:
    """Map torch.cuda.get_device_name() ("NVIDIA H100 80GB HBM3") to a GPU kind, if known."""
    lowered = device_name.lower()
    # GH200 before H200 and GB200 before B200: each name holds the other.
    if "gh200" in lowered:
        # "NVIDIA GH200 480GB" / "NVIDIA GH200 120GB" name the superchip's memory with the CPU's
        # LPDDR5X (the GPU has 96 GB); the 144 GB HBM3e part says so in its name.
        return "gh200-144g" if "144g" in lowered or "hbm3e" in lowered else "gh200"
    for kind in ("gb200", "b200", "h200", "h100"):
        if kind in lowered:
            return kind
    if "a100" in lowered:
        if "64gb" in lowered:
            return "a100-64g"
        return "a100-40g" if "40gb" in lowered else "a100"
    return None
