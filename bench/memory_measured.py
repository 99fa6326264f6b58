"""The memory estimate against the peaks Megatron-LM measured on its own functional tests
(tests/support/megatron_memory.py, held by tests/unit/config/test_memory_measured.py):

    .venv/bin/python bench/memory_measured.py

One row per run and GPU kind: the measured peak (`mem-max-allocated-bytes`, last rank), the
tensors the estimate counts there (its total less OVERHEAD_GIB, with the run's loss), the gap, and
the same after the optimizer step (`mem-allocated-bytes` against weights, gradients and the
optimizer's shard). Plain Python, a second on one core.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.megatron_memory import EP_ALLGATHER, GIB, RUNS, estimated, short  # noqa: E402


def main() -> None:
    print(f"{'run':62s} {'GPU':5s} {'peak':>6s} {'est':>6s} {'gap':>6s}   {'rest':>6s} {'est':>6s}")
    gaps = []
    for run in [*RUNS, EP_ALLGATHER]:
        for kind, peak_bytes in run.peak_bytes.items():
            mem, tensors = estimated(run, kind)
            peak, rest = peak_bytes / GIB, run.rest_bytes[kind] / GIB
            held = mem.weights_gib + mem.gradients_gib + mem.optimizer_gib
            note = "  (not held: allgather)" if run is EP_ALLGATHER else ""
            print(
                f"{short(run.case)[:62]:62s} {kind:5s} {peak:6.2f} {tensors:6.2f} "
                f"{peak - tensors:+6.2f}   {rest:6.2f} {held:6.2f}{note}"
            )
            if run is not EP_ALLGATHER:
                gaps.append((peak - tensors, peak))
    big = [gap / peak for gap, peak in gaps if peak > 10]
    print(
        f"{len(gaps)} held, peak - estimated tensors: median {statistics.median(g for g, _ in gaps):+.2f}"
        f" GiB, {min(g for g, _ in gaps):+.2f} to {max(g for g, _ in gaps):+.2f}; over 10 GiB "
        f"{min(big):+.1%} to {max(big):+.1%} of the peak"
    )


if __name__ == "__main__":
    main()
