"""What each GPU kind has: memory, dense peak throughput, and the number formats it runs.

Peaks are dense (no sparsity) tensor-core figures from NVIDIA's data sheets; MFU is measured against
the peak of the precision the run computes its GEMMs in. Memory is what `torch.cuda.mem_get_info`
reports as total, in GiB, which is a little below the marketing GB figure.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    # Per GPU, one direction, GB/s: NVLink inside the domain; the scale-out network beyond it.
    nvlink_gb_s: float = 0.0
    network_gb_s: float = 0.0
    hbm_gb_s: float = 0.0  # memory bandwidth, for the step-time model's memory-bound work


GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        # Link figures: NVLink 3 / 4 / 5 at 600 / 900 / 1800 GB/s per GPU both ways (NVIDIA's A100,
        # H100 and B200 data sheets), halved for one direction; the network as DGX A100 (one
        # 200 Gb/s HDR NIC per GPU) and DGX H100 / B200 / GB200 (one 400 Gb/s NIC per GPU) build it.
        # HBM bandwidth from the same data sheets (A100 40/80 GB 1.6/2.0 TB/s, H100 SXM 3.35,
        # H200 4.8, B200 and GB200 8 TB/s per GPU).
        GpuSpec(
            name="a100-40g",
            hbm_gb_s=1555,
            memory_gib=39.4,
            bf16_tflops=312.0,
            nvlink_gb_s=300,
            network_gb_s=25,
        ),
        GpuSpec(
            name="a100",
            hbm_gb_s=2039,
            memory_gib=79.2,
            bf16_tflops=312.0,
            nvlink_gb_s=300,
            network_gb_s=25,
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
        ),
    )
}
# The CPU smoke mode: no memory limit worth predicting, no peak to compute MFU against.
CPU = GpuSpec(name="cpu", memory_gib=float("inf"), bf16_tflops=0.0)


@dataclass(frozen=True, slots=True)
class Cluster:
    """Where a run goes: the job's size and the kind of GPU on every node."""

    num_nodes: int = 1
    gpus_per_node: int = 8
    gpu: str = "h100"
    # GPUs per NVLink domain; None: the GPU kind's (72 for GB200 NVL72), else one node.
    nvlink_domain: int | None = None

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def domain(self) -> int:
        """GPUs that reach each other over NVLink: consecutive ranks, as Slurm places them."""
        size = self.nvlink_domain or self.spec.nvlink_domain or self.gpus_per_node
        return max(1, size)

    def crosses(self, block: int) -> bool:
        """Whether blocks of `block` consecutive ranks (a TP group, a TP x CP group, the ranks
        that hold a strided group) leave their NVLink domain."""
        domain = self.domain
        return block > 1 and self.world_size > domain and (block > domain or domain % block != 0)

    @property
    def spec(self) -> GpuSpec:
        return CPU if self.gpu == "cpu" else GPUS[self.gpu]


def gpu_from_device_name(device_name: str) -> str | None:
    """Map torch.cuda.get_device_name() ("NVIDIA H100 80GB HBM3") to a GPU kind, if known."""
    lowered = device_name.lower()
    for kind in ("gb200", "b200", "h200", "h100"):
        if kind in lowered:
            return kind
    if "a100" in lowered:
        return "a100-40g" if "40gb" in lowered else "a100"
    return None
