"""Layout columns of bench/data/published_perf.csv that its source printed wrong, and what ran.

The table keeps each figure as published; `corrected` gives bench/published_table.py's `load` the
row with what the run was. A row is corrected only where two sources agree against the printed
columns: the release's own performance recipe (Megatron-Bridge at the release's tag) and either
the summary's own gradient-accumulation column (GA = GBS / (DP x MBS)) or the same recipe's
figure in the neighbouring releases, which the printed layout could not have reached.
tests/unit/config/test_published_corrections.py holds each against that evidence.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Correction:
    columns: dict[str, str]  # the table's column -> what ran
    why: str
    # Another release's row of the corrected layout: the figure a correct label sits beside.
    neighbour: str | None = None


CORRECTIONS: dict[str, Correction] = {
    "mb2509-llama370b-gb200-fp8mx-64": Correction(
        {"mbs": "1"},
        "25.09's GB200 table prints one MBS (2) for the FSDP row and, in parentheses, the FP8-MX "
        "one; its GA column gives the FP8-MX run 16 microbatches, MBS 1 at DP 8 and GBS 128, "
        "and r0.1.0 684a686165's scripts/performance/configs/llama3/llama3_70b_llm_pretrain.yaml "
        "sets gb200 fp8_mx mbs 1",
    ),
    "mb260201-qwen330ba3b-h100-fp8cs-16": Correction(
        {"pp": "1", "vp": "", "ep": "16"},
        "26.02.01 prints 26.02's PP 2, VP 12, EP 8 (5,113 tokens/s there); v0.3.1 9c9dd84896's "
        "scripts/performance/configs/qwen/qwen3_workload_base_configs.py runs "
        "QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1 at EP 16 without a pipeline, as 26.04 and "
        "26.04.01 print it (8,901 and 8,960 beside this row's 9,058)",
        neighbour="mb260401-qwen330ba3b-h100-fp8cs-16",
    ),
    "mb260201-llama370b-gb300-fp8mx-64": Correction(
        {"mbs": "1", "vp": "5"},
        "26.02.01 prints MBS 2 without virtual stages; v0.3.1 9c9dd84896's "
        "scripts/performance/configs/llama/llama3_workload_base_configs.py runs "
        "LLAMA3_70B_PRETRAIN_CONFIG_GB300_FP8_MX_V2 at PP 4, VP 5, MBS 1, as 26.02, 26.04 and "
        "26.04.01 print it (4,596 to 4,864 beside this row's 4,798); PP 4 with 8 microbatches "
        "of 2 and no virtual stages idles 3 of 11 slots",
        neighbour="mb260401-llama370b-gb300-fp8mx-64",
    ),
    "mb260201-llama370b-gb300-nvfp4-64": Correction(
        {"pp": "4", "vp": "5", "mbs": "1"},
        "26.02.01 prints TP 1, PP 1, MBS 2 without FSDP, which cannot hold Llama 3 70B's weights "
        "and gradients on one GB300; v0.3.1 9c9dd84896's "
        "scripts/performance/configs/llama/llama3_workload_base_configs.py runs "
        "LLAMA3_70B_PRETRAIN_CONFIG_GB300_NVFP4_V2 at PP 4, VP 5, MBS 1, as 26.02, 26.04 and "
        "26.04.01 print it (6,798 to 7,397 beside this row's 7,002)",
        neighbour="mb2602-llama370b-gb300-nvfp4-64",
    ),
}


def corrected(row: dict[str, str]) -> dict[str, str]:
    """The row with what its run was (itself where nothing needs correcting)."""
    fix = CORRECTIONS.get(row["id"])
    return {**row, **fix.columns} if fix else row
