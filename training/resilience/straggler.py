"""Straggler detection: which rank makes every other rank wait.

One slow GPU (throttled, a failing HBM stack, a noisy neighbour on its PCIe switch) gates every
collective of the job, so every rank's step takes as long as the slowest one's; the total step
time cannot tell the ranks apart. What differs is where the time goes: the fast ranks wait for the
slow one in the gradient sync and, with overlapped parameter gathers, in the forward pre-hook that
waits for the distributed optimizer's parameter all-gather. So each rank times, per step, the whole
step and the time spent in those waits (Megatron-Core's `config.finalize_model_grads_func` and
each DDP bucket group's `finish_param_sync`, wrapped here); the difference is its own work
("compute"). Pipeline sends and receives are not timed: a stage is compared only with itself. Every `resilience.straggler_interval` steps the ranks gather their
means over the interval (one all_gather of three numbers over the default group) and rank 0
compares each rank's compute time with the median of the other ranks of its pipeline stage (the
stages do different work, so only ranks of one stage are compared). A rank above
`resilience.straggler_factor` x that median is named on the console and in metrics.jsonl.

On a GPU the sync is timed with CUDA events, read after the step's own synchronize: no extra
synchronisation. The comparison itself is `find_straggler`, a pure function.
"""

from __future__ import annotations

import socket
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class Straggler:
    """The slowest rank relative to its peers (the ranks of its pipeline stage)."""

    rank: int
    seconds: float  # its compute time per step
    median: float  # the median compute time per step of the other ranks of its stage
    ratio: float  # seconds / median
    flagged: bool  # ratio >= the factor: a straggler


def find_straggler(
    seconds: Sequence[float], stages: Sequence[int], factor: float
) -> Straggler | None:
    """The rank whose time is the largest multiple of the median of the other ranks of its stage
    (`stages[r]`: rank r's pipeline stage); None when no stage has two ranks to compare.

    The reference leaves the candidate out, so that with two ranks a slow one is compared with
    the other one (a median over both would never exceed twice the fast time)."""
    worst: Straggler | None = None
    for rank, own in enumerate(seconds):
        peers = [t for r, t in enumerate(seconds) if r != rank and stages[r] == stages[rank]]
        if not peers:
            continue
        median = statistics.median(peers)
        ratio = own / median if median > 0 else (1.0 if own <= 0 else float("inf"))
        if worst is None or ratio > worst.ratio:
            worst = Straggler(rank, own, median, ratio, ratio >= factor)
    return worst


class SyncTimer:
    """Wraps the waits for other ranks (the gradient sync, the parameter all-gather) and adds up
    the time spent in them; `take()` returns that sum (seconds) and starts afresh. A wrapped call
    inside another is not counted twice.

    On CUDA each call records a pair of events on the current stream; their elapsed time is read in
    `take()`, which the engine calls after its end-of-step synchronize. Elsewhere: perf_counter."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._pairs: list[tuple[Any, Any]] = []
        self._seconds = 0.0
        self._depth = 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:  # inside another timed call: already counted
                return fn(*args, **kwargs)
            self._depth += 1
            try:
                return self._timed(fn, *args, **kwargs)
            finally:
                self._depth -= 1

        return timed

    def _timed(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.cuda:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            try:
                return fn(*args, **kwargs)
            finally:
                end.record()
                self._pairs.append((start, end))
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self._seconds += time.perf_counter() - t0

    def discard(self) -> None:
        """Forget what was timed so far (waits outside a training step, e.g. evaluation's),
        without reading events that may not have completed."""
        self._seconds, self._pairs = 0.0, []

    def take(self) -> float:
        seconds = self._seconds + sum(s.elapsed_time(e) for s, e in self._pairs) / 1000.0
        self._seconds, self._pairs = 0.0, []
        return seconds


class StragglerMonitor:
    """Per-step timings of this rank; every `interval` steps, the gather and rank 0's verdict."""

    def __init__(
        self,
        interval: int,
        factor: float,
        device: torch.device,
        stage: int,
        say: Callable[[str], None] = lambda line: print(line, flush=True),
    ) -> None:
        self.interval, self.factor, self.device, self.stage = interval, factor, device, stage
        self.sync = SyncTimer(device)
        self.say = say
        self._step_s = self._sync_s = 0.0
        self._count = 0
        self._hosts: list[str] | None = None

    def wrap_sync(self, config: Any, model: Sequence[Any]) -> None:
        """Time the waits for other ranks: the gradient sync that `config` (the TransformerConfig
        the schedules read) names, and the parameter all-gathers of `model`'s DDP chunks."""
        if self.interval <= 0:
            return
        if config.finalize_model_grads_func is not None:
            config.finalize_model_grads_func = self.sync.wrap(config.finalize_model_grads_func)
        for chunk in model:
            groups = getattr(chunk, "bucket_groups", []) + getattr(
                chunk, "expert_parallel_bucket_groups", []
            )
            for group in groups:
                group.finish_param_sync = self.sync.wrap(group.finish_param_sync)

    def observe(self, step: int, step_seconds: float) -> dict[str, Any]:
        """Record one step (call after its synchronize, on every rank). Every `interval` steps a
        collective: returns, on rank 0, the metrics to log (straggler_rank: None when no rank is
        over the factor; straggler_ratio: the slowest rank's ratio); otherwise {}."""
        if self.interval <= 0:
            return {}
        self._step_s += step_seconds
        self._sync_s += self.sync.take()
        self._count += 1
        if step % self.interval:
            return {}
        mine = [self._step_s / self._count, self._sync_s / self._count, float(self.stage)]
        self._step_s = self._sync_s = 0.0
        self._count = 0
        world = dist.get_world_size()
        gathered = torch.zeros(world * 3, dtype=torch.float64, device=self.device)
        dist.all_gather_into_tensor(
            gathered, torch.tensor(mine, dtype=torch.float64, device=self.device)
        )
        if self._hosts is None:  # once: which node each rank runs on, for the message
            self._hosts = [""] * world
            dist.all_gather_object(self._hosts, socket.gethostname())
        if dist.get_rank() != 0:
            return {}
        rows = gathered.view(world, 3).tolist()
        compute = [max(step_s - sync_s, 0.0) for step_s, sync_s, _ in rows]
        found = find_straggler(compute, [int(r[2]) for r in rows], self.factor)
        if found is None:
            return {}
        if found.flagged:
            total = rows[found.rank][0]
            self.say(
                f"straggler: rank {found.rank} (node {self._hosts[found.rank]}) computes "
                f"{found.seconds:.3f} s per step vs median {found.median:.3f} s of its peers "
                f"({found.ratio:.2f}x, resilience.straggler_factor={self.factor}); step "
                f"{total:.3f} s: the other ranks wait for it"
            )
        return {
            "straggler_rank": found.rank if found.flagged else None,
            "straggler_ratio": found.ratio,
        }
