"""The wait for the slowest GPU: identical GPUs run a little apart (Sinha et al., SC'22: 8% average
variation across a cluster), and every synchronous step waits for the slowest of the job's. The
expected maximum of n normal draws is held to a simulation and to Tippett's (1925) table; how the
term scales a layout to more GPUs is held to NVIDIA's runs in test_plan_heldout.py.
"""

from __future__ import annotations

import pytest

from config.cost.collectives import slowest_of
from config.cost.constants import VALUES
from config.cost.steptime import predict
from config.hardware import Cluster
from config.rules import derive
from recipes.registry import resolve


@pytest.mark.parametrize("n", [2, 8, 64, 1024])
def test_the_slowest_of_n_is_what_a_simulation_draws(n: int) -> None:
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(29)
    draws = np.concatenate([rng.standard_normal((2_000, n)).max(axis=1) for _ in range(10)])
    error = draws.std() / len(draws) ** 0.5
    assert abs(slowest_of(n) - draws.mean()) < 4 * error


def test_the_slowest_of_n_is_tippetts() -> None:
    # L. H. C. Tippett (1925), Biometrika 17: the mean of the largest of n normal draws.
    for n, mean in ((1, 0.0), (2, 0.56419), (10, 1.53875), (100, 2.50759), (1000, 3.24144)):
        assert slowest_of(n) == pytest.approx(mean, abs=1e-3)


def test_the_wait_grows_with_the_gpus_and_is_no_bottleneck() -> None:
    """The same layout on 1 and 128 nodes: the straggler term is gpu_speed_sigma x slowest_of(GPUs)
    of the compute, which the layout cannot change, so it never names the bottleneck."""
    _, cfg = resolve("llama3_8b_pretrain", ["train.global_batch_size=1024"])
    steps = {}
    for nodes in (1, 128):
        cluster = Cluster(nodes, 8, "h100")
        steps[nodes] = predict(cfg, cluster, derive(cfg, cluster))
    for nodes, step in steps.items():
        compute = sum(step.terms[t] for t in ("gemm", "attention", "memory"))
        share = VALUES["gpu_speed_sigma"] * slowest_of(nodes * 8)
        assert step.terms["straggler"] == pytest.approx(share * compute, rel=1e-9)
        assert step.bottleneck[0] != "straggler"
    # As a share of the step: over twice as much on 1,024 GPUs as on 8.
    shares = {n: step.terms["straggler"] / step.seconds for n, step in steps.items()}
    assert shares[128] > 2 * shares[1] > 0
    without = predict(cfg, Cluster(1, 8, "h100"), derive(cfg, Cluster(1, 8, "h100")),
                      {**VALUES, "gpu_speed_sigma": 0.0})  # fmt: skip
    assert without.terms["straggler"] == 0.0
