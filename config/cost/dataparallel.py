"""The data-parallel part of a step (config/cost/steptime.py): the gradients' reduction and the
parameters' gather that the backward and forward do not hide, and the optimizer step.

Reduce-scatter the gradients, all-gather the parameters (the distributed optimizer) or all-reduce
(twice a reduce-scatter), bucket by bucket; the last microbatch's backward and the first one's
forward hide what overlaps, except the last bucket's reduction (the backward has ended) and the
first bucket's gather (the forward waits for it): buckets grow with the data-parallel size
(config/layout.py). Megatron-FSDP does it for every microbatch (the weights twice, for forward and
backward), behind every one's compute. What overlaps slows that compute a little (SMs and HBM
bandwidth taken: overlap_contention)."""

from __future__ import annotations

from config.cost.collectives import ring, ring_latency
from config.finalize import Derived
from config.hardware import Cluster
from config.layout import ddp_bucket_size
from config.schema import TrainingConfig


def seconds(
    cfg: TrainingConfig,
    cluster: Cluster,
    derived: Derived,
    k: dict[str, float],
    params: tuple[float, float],
    vpp: int,
    microbatch_s: float,
) -> tuple[float, float]:
    """(exposed data-parallel seconds, optimizer-step seconds) of a step, for the slowest rank's
    (dense, expert) parameters and its seconds per microbatch (forward + backward)."""
    par, moe = cfg.parallel, bool(cfg.model.num_moe_experts)
    microbatches = derived.num_microbatches
    dense_p, expert_p = params
    t, c = par.tensor_model_parallel_size, par.context_parallel_size
    grad = 4 if par.grad_reduce_in_fp32 else 2
    sharded = cfg.optimizer.use_distributed_optimizer
    dense_group = derived.data_parallel_size * c
    edp = derived.expert_data_parallel_size
    et = derived.expert_tensor_parallel_size if moe else 1
    e = par.expert_model_parallel_size if moe else 1
    reduce, gather, tail_reduce, tail_gather = 0.0, 0.0, 0.0, 0.0
    passes = 1 if sharded else 2  # an all-reduce is a reduce-scatter and an all-gather
    fsdp = par.use_megatron_fsdp  # not DDP's buckets: priced by bandwidth alone
    for group_params, group, stride in ((dense_p, dense_group, t * c), (expert_p, edp, e * et)):
        if group > 1 and group_params:
            per_param = (group - 1) / group / ring(cluster, group, stride, k)
            latency = 0.0 if fsdp else ring_latency(cluster, group, stride, k)
            # The first stage's first chunk in buckets, every other chunk in one (ddp_bucket_size).
            bucket = group_params / vpp
            if par.overlap_grad_reduce:
                bucket = min(bucket, ddp_bucket_size(dense_group))
            buckets = -(-group_params / vpp // bucket) + vpp - 1
            reduce += passes * (grad * group_params * per_param + buckets * latency)
            tail_reduce += passes * (grad * bucket * per_param + latency)
            if sharded:
                gather += 2 * group_params * per_param + buckets * latency
                tail_gather += 2 * bucket * per_param + latency
    backward = 2 / 3 * microbatch_s
    if fsdp:  # per microbatch: weights gathered twice (BF16), grads scattered
        reduce, gather = reduce * microbatches, gather * 2 * microbatches
        backward, forward = backward * microbatches, microbatch_s / 3 * microbatches
        tail_reduce = tail_gather = 0.0  # behind the next microbatch's compute
    else:
        forward = microbatch_s / 3  # the first microbatch's
    hidden = 0.0  # what overlaps compute slows it a little (SMs and HBM bandwidth taken)
    if par.overlap_grad_reduce:
        exposed = min(reduce, max(reduce - backward, tail_reduce))
        hidden, reduce = reduce - exposed, exposed
    if par.overlap_param_gather and sharded:
        exposed = min(gather, max(gather - forward, tail_gather))
        hidden, gather = hidden + gather - exposed, exposed
    shard = dense_p / dense_group + expert_p / edp if sharded else dense_p + expert_p
    optimizer = k["optimizer_bytes"] * shard / (cluster.spec.hbm_gb_s * 1e9)
    return reduce + gather + k["overlap_contention"] * hidden, optimizer
