"""The constants of the step-time model (config/cost/steptime.py), each with its source: data-sheet figures
live in config/hardware.py, these are the fractions of them a training step reaches, and the
calibrated shapes of its slowdowns (bench/plan_calibration.py fits them on published runs)."""

from __future__ import annotations

# The last refit, on the calibration part of bench/data/published_perf.csv, of the constants whose
# sources name it.
_REFIT = (
    "refitted on 2026-11-29 with the experts' launches priced (KERNELS_PER_LAYER) by "
    "bench/plan_calibration.py --table --search --rounds 8 --only layer_overhead_s,"
    "expert_half_dim,expert_half_dim_blackwell,expert_half_dim_fused,memory_passes,"
    "gemm_fp8_blackwell,gemm_bf16_blackwell (calibration fit loss 0.1185 to 0.1130)"
)
# The refit since, with the dropless alltoall's host waits priced (alltoall_sync_s, from 7.6e-5).
_REFIT_SYNC = (
    "refitted on 2026-11-29 with alltoall_sync_s priced, from 7.6e-5, by "
    "bench/plan_calibration.py --table --search --rounds 8 --only alltoall_sync_s,"
    "expert_half_dim,expert_half_dim_blackwell,gemm_bf16_blackwell,gemm_fp8_blackwell,"
    "layer_overhead_s (calibration fit loss 0.1130 to 0.1067)"
)

# name -> (value, source). Fractions are of config/hardware.py's data-sheet peaks and links.
CONSTANTS: dict[str, tuple[float, str]] = {
    "gemm_bf16": (
        0.70,
        "calibrated on the BF16 runs of tests/support/published_runs.py (Llama 3.1 8B, 70B, 405B): "
        "~690 of 989 TFLOPS, below the 700-800 that large square BF16 GEMMs reach on H100 SXM, "
        "as a layer's GEMMs are neither square nor alone. Also the output layer's on every GPU: "
        "Megatron-Core's one BF16 GEMM of tokens x hidden x vocabulary / TP, outside Transformer "
        "Engine, larger than any of a layer's. Priced at gemm_bf16_blackwell (fitted on whole "
        "layers) it made the pipeline rank holding the loss 1.42x the others for DeepSeek-V3 "
        "(with its MTP layer's second output) at PP 16 on 256 B200s (1.20x now), 1.17x for Qwen3 "
        "235B-A22B at PP 8 on GB200s (1.09x now); as a fraction of its "
        "own on Blackwell, 0.46, 0.55, 0.65, 0.70 and 0.80 gave calibration fit losses of "
        "0.1026, 0.1003, 0.0994, 0.0996 and 0.1024 (bench/plan_calibration.py fit_loss), so it "
        "takes this one, not a fitted rate (not measured on a Blackwell GPU here)",
    ),
    "gemm_fp8": (
        0.58,
        "calibrated on the FP8 runs of tests/support/published_runs.py (Llama 3 70B, 3.1 405B): "
        "~1,150 of 1,979 TFLOPS; FP8 GEMMs sit further from their peak than BF16 ones",
    ),
    "gemm_fp4": (
        0.361,
        "NVFP4 on Blackwell, of config/hardware.py's dense FP4 peak; fitted on the calibration "
        "part of bench/data/published_perf.csv (bench/plan_calibration.py --table --search)",
    ),
    "gemm_bf16_blackwell": (
        0.4593,
        "BF16 on Blackwell (B200, GB200, B300, GB300), of the dense BF16 peak; fitted as "
        "gemm_fp4, 0.567 until " + _REFIT + ", 0.5103 until " + _REFIT_SYNC,
    ),
    "gemm_fp8_blackwell": (
        0.517,
        "FP8 on Blackwell, per-tensor (current), blockwise or MXFP8 scaling alike: the data sheet "
        "gives Blackwell's tensor cores one FP8 rate and they apply MXFP8's block scales inside "
        "the MMA (MXFP8's extra casts are fp8_cast_bytes'); fitted as gemm_fp4. A rate of its "
        "own for MXFP8, fitted apart, went to 0.70 (above cuBLAS's large-GEMM figures) on "
        "MoE runs whose other costs the model misses, and priced dense MXFP8 20-36% fast. "
        "0.47 until gemm_half_dim_blackwell was fitted with it (below)",
    ),
    "attention_blackwell": (
        0.446,
        "flash attention forward + backward on Blackwell (cuDNN's fused attention), of the dense "
        "BF16 peak; fitted as gemm_fp4",
    ),
    "blackwell_ultra": (
        1.21,
        "Blackwell Ultra's (B300, GB300) GEMM rates over B200's at the same data-sheet peaks: "
        "its higher power limit (1,400 W) holds higher clocks; fitted as gemm_fp4",
    ),
    "stage_overhead_s": (
        2e-04,
        "fixed seconds per model chunk and microbatch beyond its layers' own (its sends and "
        "receives posted and waited on, the schedule's host work): priced so one layer per "
        "virtual stage is not free; fitted on the calibration part of "
        "bench/data/published_perf.csv with the published layouts' ranks in the objective (the "
        "errors alone put it at 8e-5 and the planner at 10-20 virtual stages where NVIDIA runs "
        "4-8): on its 89 runs of then 2e-4 ranked 46% of them in the top 5 (43% at 8e-5), 3e-4 "
        "and more cost Llama 3.1 70B BF16 on 64 H100s its top-5 place in "
        "tests/support/published_runs.py; on the 139 of today 58% at both (--table --compare)",
    ),
    "gemm_half_dim": (
        128.0,
        "the GEMM dimension at which a GEMM would lose half its rate (the rate falls as "
        "1 / (1 + d0/M + d0/N + d0/K)): tensor-core tiles are 128-256 wide, so a shard narrower "
        "than a few tiles wastes them; calibrated",
    ),
    "gemm_half_dim_blackwell": (
        256.0,
        "gemm_half_dim on Blackwell, whose tensor cores take tiles twice as wide (tcgen05 MMAs "
        "of up to 256 x 256 over two SMs, against Hopper's 64 x 256 per warpgroup): a narrow "
        "shard wastes more of them, and a wide GEMM gets nearer the peak. Fitted on the "
        "calibration part of bench/data/published_perf.csv with gemm_fp8_blackwell and "
        "expert_half_dim_fused (the Blackwell GEMM constants refitted at each value; before the "
        "fused loss, memory_passes): fit loss 0.1199 at 141 (0.1206 at the shared 128), 0.1206 "
        "at 192, 0.1188 at 256, 0.1192 at 384",
    ),
    "expert_half_dim": (
        3930.0,
        "the same for an MoE expert's own width (FC1's and FC2's expert side, split by ETP) in "
        "its grouped GEMM, which runs far from cuBLAS's dense rate when narrow (Megatron-Core's "
        "TE grouped GEMM, tokens per expert varying); its rows (the tokens it receives) and its "
        "hidden side take gemm_half_dim, as a dense layer's do. Fitted on the calibration part "
        "of bench/data/published_perf.csv with the two below (bench/plan_calibration.py --table "
        "--search --only expert_half_dim,expert_half_dim_blackwell,expert_half_dim_fused: fit "
        "loss 0.1135). Until 2026-11-28 it also took the hidden side (3250 then), which priced "
        "Grok-1's experts (32,768 wide, at ETP 1) at half the dense rate and its 8 runs 11-31% "
        "slow",
    ),
    "expert_half_dim_blackwell": (
        2807.0,
        "expert_half_dim on Blackwell (TE's grouped GEMM: a cuBLAS GEMM per expert); fitted "
        "with it, 3850 until " + _REFIT + ", 3465 until " + _REFIT_SYNC,
    ),
    "expert_half_dim_fused": (
        805.2,
        "expert_half_dim for Transformer Engine's fused grouped MLP (model.moe_fused_grouped_mlp: "
        "FC1, activation and FC2 in one CuTe DSL kernel on Blackwell, no quantize or activation "
        "pass between them); fitted with it, on the calibration part's 8 fused runs (Qwen3 "
        "30B-A3B, DeepSeek-V3, GPT-OSS 120B; MXFP8, 26.06 and 26.08) among the others; 732 "
        "until " + _REFIT,
    ),
    "attention_half_len": (
        512.0,
        "the query/key block length at which flash attention loses half its rate: context "
        "parallelism runs it on blocks of seq/CP; calibrated",
    ),
    "attention": (
        0.45,
        "flash attention forward + backward, causal, head dim 128, BF16 on H100: FlashAttention-3 "
        "(Shah et al. 2024) reports 600-740 TFLOPS forward and less backward; ~450 of 989 for both",
    ),
    "memory_passes": (
        4.84,
        "memory-bound kernels read and write each saved activation about four times (forward "
        "write, backward read, norm and activation kernels); calibrated. 4.0 until the loss was "
        "priced as Transformer Engine's fused cross entropy (2 bytes per logit, not 6: "
        "config/cost/memory.py logit_bytes); refitted then with layer_overhead_s on the "
        "calibration part of bench/data/published_perf.csv (fit loss 0.1221 unrefitted, 0.1189 "
        "at 4.4, 0.1171 with layer_overhead_s 3.3e-4). Since the engine's default loss became "
        "Megatron-Core's (6 bytes, TE's a setting the Megatron-Bridge rows carry) not refitted: "
        "a refit with layer_overhead_s moved the calibration fit loss 0.1108 to 0.1088 and the "
        "held-out median up, 4.0% to 4.1%. 4.4 until " + _REFIT,
    ),
    "fp8_cast_bytes": (
        6.0,
        "bytes moved per FP8 GEMM input element: amax read (2) + BF16 read (2) + FP8 write (1) "
        "forward, ~the same for the gradient; TE's current-scaling cast kernels",
    ),
    "nvlink": (
        0.80,
        "NCCL bus bandwidth / NVLink's one-way figure: large all-reduces on DGX H100 measure "
        "~360-480 GB/s (nccl-tests, with and without NVLink SHARP)",
    ),
    "network": (
        0.90,
        "NCCL bus bandwidth / NIC line rate across nodes: ~45 of 50 GB/s per 400 Gb/s NIC, what "
        "nccl-tests measure across DGX H100 nodes on InfiniBand NDR",
    ),
    "host_link": (
        0.80,
        "pinned host-device copies / the link's one-way figure (config/hardware.py host_gb_s): "
        "cudaMemcpyAsync between pinned host memory and an H100 over PCIe Gen5 x16 moves ~50-55 "
        "of 63 GB/s (CUDA's bandwidthTest, nvbandwidth); taken for NVLink-C2C too. Not fitted: "
        "on the published runs that offload (Megatron-FSDP on GB200 and GB300, bench/"
        "published_table.py OFFLOAD_SETTINGS) the copies are priced at 5-6% of Llama 3 70B's "
        "FP8 steps, which moves their errors from +3.5%, -2.3% and -9.1% to -2.7%, -8.1% and "
        "-13.3%: the copies hide better than this, or a GB200 GPU's share of the superchip's "
        "C2C link is more than half of it",
    ),
    "tp_exposed": (
        0.40,
        "share of TP collectives not hidden: TE's userbuffers overlap the rest with the GEMMs "
        "(Megatron-Bridge performance configs set tp_comm_overlap); calibrated",
    ),
    "p2p_exposed": (
        0.30,
        "share of pipeline sends not hidden: the interleaved schedule overlaps them "
        "(overlap_p2p_comm), 1F1B batches them with compute; calibrated",
    ),
    "overlap_contention": (
        0.2,
        "share of a data-parallel collective's time that the compute it overlaps loses: NCCL's "
        "kernels (DeepEP's: 20-24 SMs) take SMs (up to 32 of H100's 132) and HBM bandwidth from "
        "the GEMMs; it counts where communication overlaps every microbatch (Megatron-FSDP, the "
        "MoE alltoall overlap), not once a step; calibrated",
    ),
    "layer_overhead_s": (
        2.97e-4,
        "fixed seconds per layer and microbatch, forward and backward: ~60 kernel launches at "
        "~5 us each when the host issues them (no CUDA graphs), which small work units do not "
        "hide; calibrated (3e-4 before the refit with memory_passes, then 3.3e-4 until "
        + _REFIT
        + ")",
    ),
    "alltoall_sync_s": (
        9.2e-5,
        "host seconds per local expert, MoE layer and microbatch of the dropless alltoall "
        "dispatcher: Megatron-Core's waits on the host for the token counts before its exchange "
        "(token_dispatcher.py, cuda_sync_point before_ep_alltoall), the GPU drains, and the host "
        "then issues the permutation, the exchange and each local expert's GEMMs while the GPU "
        "waits; padded token dropping knows every shape on the host (drop_and_pad) and never "
        "waits. Measured by NVIDIA at one layout, padded dropping on the alltoall in "
        "Megatron-Bridge 25.09, dropless in 25.11 (16 local experts each): Qwen3 30B-A3B on 8 "
        "B200s 18,066 tokens/s/GPU (FP8) then 9,299 (MXFP8), on 16 H100s 10,494 then 5,275 (with "
        "the alltoall overlap), Qwen3 235B-A22B MXFP8 on 64 B200s 4,275 then 3,269 (overlapped); "
        "dropless on the flex dispatcher lost nothing (Qwen3 30B-A3B on 8 GB200s, 23,723 then "
        "23,766). Not explained: DeepSeek-V3 MXFP8 on 256 B200s (32 local experts) kept its "
        "speed dropless on the alltoall (2,159 then 2,139). Fitted on the calibration part of "
        "bench/data/published_perf.csv: " + _REFIT_SYNC,
    ),
    "chunk_wait_s": (
        1e-3,
        "host seconds per local expert that each model chunk of the interleaved pipeline schedule "
        "waits, per microbatch, on the dropless alltoall dispatcher, beyond what the chunk's MoE "
        "GEMMs hide (chunk_wait_hidden): the dispatcher's host sync (host_waits) holds the host "
        "while the schedule's sends and receives between chunks wait to be posted. Measured by "
        "NVIDIA on the dropless alltoall, 16 local experts (Megatron-Bridge 26.02): Qwen3 "
        "235B-A22B MXFP8 at PP 8 with 4 virtual stages on 256 B300s 2,691 tokens/s/GPU, at PP 8 "
        "without on 256 B200s 3,805; with 4 local experts (EP 32) at PP 8 VP 4 on H100s it lost "
        "nothing the model misses. Fitted on the calibration part of "
        "bench/data/published_perf.csv with chunk_wait_hidden (--table --search --only "
        "chunk_wait_s,chunk_wait_hidden: fit loss 0.0998 to 0.0907; a local minimum at 10% steps)",
    ),
    "chunk_wait_hidden": (
        0.5,
        "share of an MoE layer's GEMM seconds behind which chunk_wait_s's host time hides; "
        "fitted with it",
    ),
    "ring_base_s": (
        8.4e-6,
        "NCCL's base latency of a ring collective, Simple protocol (src/graph/tuning.cc, "
        "baseLat); the protocol of large messages",
    ),
    "ring_step_nvlink_s": (
        3.4e-6,
        "NCCL's latency per ring step inside an NVLink domain, Simple protocol "
        "(src/graph/tuning.cc, hwLat NVLINK Ring)",
    ),
    "ring_step_network_s": (
        14e-6,
        "NCCL's latency per ring step between nodes, Simple protocol (src/graph/tuning.cc, "
        "hwLat NET Ring)",
    ),
    "gpu_speed_sigma": (
        0.01,
        "standard deviation of one GPU's speed around its kind's mean (manufacturing and power "
        "management): every step waits for the slowest of the job's GPUs, the expected maximum "
        "of that many normal draws (config/cost/collectives.py `slowest_of`). Sinha et al., SC'22 "
        "(arXiv 2208.11035) measured 8% average performance variation across identical GPUs of "
        "four clusters of thousands, about 2 x 3.6 standard deviations of 1.1%. Fitted on the "
        "calibration part of bench/data/published_perf.csv: fit loss 0.146 at 0, 0.137 at "
        "0.0075, 0.134 at 0.01, 0.136 at 0.0125, 0.139 at 0.015, 0.142 at 0.02; where NVIDIA "
        "ran one layout at 4x the GPUs or more, the predicted throughput ratio is 1.0% too "
        "high on average at 0 and 0.35% at 0.01 (19 calibration series)",
    ),
    "optimizer_bytes": (
        32.0,
        "bytes per parameter of the optimizer step: read and write the FP32 master and both Adam "
        "moments (24), read the gradient (4) and write the BF16 weight (2), rounded up",
    ),
}
VALUES: dict[str, float] = {name: value for name, (value, _) in CONSTANTS.items()}

# The kernel launches layer_overhead_s stands for (its source: ~60 at ~5 us each). A launch a
# layer makes beyond those costs layer_overhead_s / KERNELS_PER_LAYER: Transformer Engine's grouped
# GEMM launches one cuBLAS GEMM per local expert (config/cost/steptime.py).
KERNELS_PER_LAYER = 60

# Where a fit on published runs may move a constant (bench/plan_calibration.py --search): a
# constant that leaves its physical range there is standing in for a cost the model lacks.
BOUNDS: dict[str, tuple[float, float]] = {
    # Fractions of a data-sheet peak: below 0.3 no tuned GEMM library sits on large GEMMs, above
    # 0.85 none reaches (cuBLAS's best square GEMMs on H100 and B200).
    **{
        name: (0.3, 0.85)
        for name in (
            "gemm_bf16",
            "gemm_fp8",
            "gemm_fp4",
            "gemm_bf16_blackwell",
            "gemm_fp8_blackwell",
            "attention",
            "attention_blackwell",
        )
    },  # fmt: skip
    # Blackwell Ultra over Blackwell at equal data-sheet peaks: clocks, not more tensor cores.
    "blackwell_ultra": (1.0, 1.3),
    # Per chunk and microbatch: a few kernel launches and posted sends, up to half a millisecond.
    "stage_overhead_s": (0.0, 5e-4),
    "layer_overhead_s": (5e-5, 1e-3),
    # A host's issue time per local expert: from a few launches (~5 us each) to a millisecond.
    "alltoall_sync_s": (1e-5, 1e-3),
    "chunk_wait_s": (0.0, 5e-3),  # up to a few ms of host issue time per local expert
    "chunk_wait_hidden": (0.0, 2.0),
    # Identical GPUs of one cluster: up to a few percent apart (Sinha et al., SC'22).
    "gpu_speed_sigma": (0.0, 0.03),
    # An expert's width at which its grouped GEMM loses half its rate: from a tile to the
    # widest expert of the table's models (Grok-1's 32,768 split by ETP 4).
    "expert_half_dim": (128.0, 8192.0),
    "expert_half_dim_blackwell": (128.0, 8192.0),
    "expert_half_dim_fused": (128.0, 3250.0),  # no worse than the unfused kernels
    "gemm_half_dim": (32.0, 512.0),
    "gemm_half_dim_blackwell": (32.0, 512.0),
    "nvlink": (0.5, 0.95),
    "network": (0.5, 0.95),
    "host_link": (0.5, 0.95),
    # NCCL's latencies (src/graph/tuning.cc), within a factor of two of its figures.
    **{
        name: (VALUES[name] / 2, VALUES[name] * 2)
        for name in ("ring_base_s", "ring_step_nvlink_s", "ring_step_network_s")
    },  # fmt: skip
    **{name: (0.0, 1.0) for name in ("tp_exposed", "p2p_exposed", "overlap_contention")},
}

# What the published runs cannot tell apart: `recipes plan` lists beside each layout the other
# pipeline splits (virtual stages, layout) of its TP, PP, CP and EP that some value in the range
# makes as fast (recipes/advice/plan.py `ties`). stage_overhead_s is the one cost that grows with
# the virtual stages; from what the errors alone fit (8e-5) to twice its value, the 139
# calibration runs of bench/data/published_perf.csv are flat: median error 4.8% to 4.7%,
# published layout in the top 5 56% to 55% (bench/plan_calibration.py --table --compare
# stage_overhead_s=4e-5,8e-5,1e-4,2e-4,4e-4,5e-4: 4.9% 56%, 4.8% 56%, 4.8% 57%, 4.7% 56%,
# 4.7% 55%, 4.7% 55%).
TIE_RANGE: dict[str, tuple[float, float]] = {"stage_overhead_s": (8e-5, 4e-4)}

# What a prediction is worth: |predicted / measured - 1| on the held-out part of
# bench/data/published_perf.csv, NVIDIA runs no constant was fitted on (bench/plan_calibration.py
# --table; BENCHMARKS.md), apart for dense and MoE models: the MoE runs' errors are twice the dense
# ones' at the median and four times at the 90th percentile, so one figure for both would flatter
# every MoE plan. `recipes plan` prints its model's kind's beside the layouts it cannot tell
# apart; tests/unit/config/test_plan_heldout.py recomputes them, so they move with the model.
HELD_OUT_ERROR: dict[str, dict[str, float]] = {
    "dense": {"runs": 41, "median": 0.032, "p90": 0.100},
    "moe": {"runs": 23, "median": 0.061, "p90": 0.387},
}
# The same on A100s, which no run of that part used: Megatron-LM's, NVIDIA's of 2021 on DGX A100s
# and JSC's of 2023 on JUWELS Booster's 4-GPU nodes, each priced with what its software ran
# (bench/plan_calibration.py megatron_lm_a100), never fitted on; `plan` on A100s.
A100_ERROR: dict[str, float] = {"runs": 12, "median": 0.026, "max": 0.077}
