"""The engine in this process, on a one-rank gloo group: seconds, not a torchrun start-up per test.

A 2-layer GPT on Megatron-Core (the CPU mode of training/cpu_mode.py): one train step against a
recorded loss, the loss reduction, the data-parallel sampler, an exact resume through the
checkpointer, and a data kind added by a test (its module plus one registry entry) trained through
`training.pretrain`. The multi-process layouts (TP, PP, EP, DP) are tests/smoke/.
"""

from __future__ import annotations

import gc
import json
import math
import os
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from config.hardware import Cluster
from config.registry import DataKind, register_data_kind, unregister_data_kind
from config.rules import derive
from config.schema import (
    CheckpointConfig,
    DataConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    SchedulerConfig,
    TrainConfig,
    TrainingConfig,
)
from config.tree import apply_overrides
from data.batches import DataParallelSampler, on_device

ONE_CPU = Cluster(num_nodes=1, gpus_per_node=1, gpu="cpu")
# Recorded with torch 2.11 / megatron-core 0.19.2 on the CPU (BF16 weights, FP32 master): the
# first step's loss of this seed. A random init predicts ~uniformly over 256 ids: ln 256 = 5.545.
FIRST_LOSS = 5.557828


def tiny(run_dir: Path, **train: Any) -> TrainingConfig:
    return TrainingConfig(
        name="tiny",
        model=ModelConfig(
            num_layers=2,
            hidden_size=64,
            ffn_hidden_size=128,
            num_attention_heads=4,
            num_query_groups=2,
            seq_length=32,
            vocab_size=256,
        ),
        optimizer=OptimizerConfig(lr=3e-3, min_lr=3e-4),
        scheduler=SchedulerConfig(warmup_steps=1),
        data=DataConfig(kind="mock"),
        train=TrainConfig(
            **{"global_batch_size": 4, "micro_batch_size": 2, "max_steps": 4, "device": "cpu"}
            | train
        ),
        checkpoint=CheckpointConfig(save_interval=1000, keep_last=0),
        logging=LoggingConfig(run_dir=str(run_dir), tensorboard=False, progress_bar=False),
    )


@pytest.fixture(scope="module")
def one_rank() -> Iterator[None]:
    """A one-rank gloo group for the module; the engine leaves a group it did not create alone."""
    from training import distributed
    from training.ranks import Launch

    saved = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    created = distributed.init_process_group(Launch(0, 1, 0, 1), "cpu")
    yield
    if created:
        distributed.destroy()
    for key, value in saved.items():  # later tests start torchrun with this environment
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def trainer_for(cfg: TrainingConfig) -> Any:
    from training.engine import Trainer

    return Trainer(cfg, derive(cfg, ONE_CPU), "cpu", Path(cfg.logging.run_dir))


def checkpointer_for(trainer: Any, run_dir: Path, cfg: TrainingConfig | None = None) -> Any:
    """A Checkpointer in `run_dir` over the trainer's model, optimizer and states, for `cfg` (the
    trainer's own unless a test resumes it under another)."""
    from training.checkpoint.store import Checkpointer

    return Checkpointer(
        cfg or trainer.cfg,
        run_dir,
        "cpu",
        model=trainer.model,
        optimizer=trainer.optimizer,
        states=trainer.checkpoint_states(),
    )


def train(cfg: TrainingConfig) -> None:
    """Train `cfg` to its max_steps in this process, and close the trainer however it ends."""
    trainer = trainer_for(cfg)
    try:
        trainer.train()
    finally:
        trainer.close()


def losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def test_train_step_gives_the_recorded_loss(one_rank: None, tmp_path: Path) -> None:
    train(tiny(tmp_path, max_steps=3))
    first, *rest = losses(tmp_path)
    assert first == pytest.approx(FIRST_LOSS, abs=1e-5)
    assert abs(first - math.log(256)) < 0.1
    assert rest[-1] < first  # mock documents count upwards: the model picks that up at once
    # No GPU figures on the CPU: there is no accelerator for TFLOP/s or MFU to describe.
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["tflops_per_gpu"] is None and r["mfu"] is None for r in rows)


def test_loss_is_the_mean_over_microbatches_of_each_ones_token_mean(one_rank: None) -> None:
    from megatron.core import parallel_state

    from training.step import _global_loss, loss_func

    per_token = torch.tensor([[1.0, 2.0, 3.0, 9.0]])
    total, tokens, report = loss_func(torch.tensor([[1.0, 1.0, 1.0, 0.0]]), per_token)
    assert total.item() == 6.0 and tokens.item() == 3  # the masked position carries no loss
    second = {"lm loss": torch.tensor([4.0, 1.0])}
    # Microbatch means 2 and 4 average to 3, whatever their token counts (Megatron's reduction).
    parallel_state.initialize_model_parallel()  # the DP and PP groups it sums over: one rank
    try:
        assert _global_loss([report, second], torch.device("cpu")) == pytest.approx(3.0)
    finally:
        parallel_state.destroy_model_parallel()


def test_sampler_hands_each_rank_its_slice_from_the_position() -> None:
    ranks = [list(DataParallelSampler(20, 8, 2, r, 2)) for r in range(2)]
    assert ranks == [[[8, 9], [12, 13], [16, 17]], [[10, 11], [14, 15], [18, 19]]]
    assert len(DataParallelSampler(20, 8, 2, 0, 2)) == 3
    micro = [{"tokens": torch.zeros(2)}]
    assert on_device(micro, "cpu") is micro  # the CPU mode uses batches where they are


@pytest.mark.parametrize(
    ("precision", "dropout"), [("bf16_mixed", 0.0), ("bf16_mixed", 0.1), ("fp32", 0.0)]
)
def test_checkpointer_resumes_exactly(
    one_rank: None, tmp_path: Path, precision: str, dropout: float
) -> None:
    """Save at step 2, run to 8; a fresh trainer resumed from step 2 gives the same steps 3-8,
    bitwise, with dropout on too (its random masks continue the saved RNG streams), and in FP32
    (the distributed optimizer's main weights are the model's own there: until 2026-11-28 their
    load raised in autograd and the run reported no checkpoint it could resume from)."""

    def run(folder: Path, resume: bool) -> list[float]:
        cfg = tiny(folder, max_steps=8)
        cfg.precision = precision
        assert cfg.optimizer.use_distributed_optimizer
        cfg.model.hidden_dropout = cfg.model.attention_dropout = dropout
        cfg.checkpoint.save_dir, cfg.checkpoint.save_interval = str(tmp_path / "ckpt"), 2
        trainer = trainer_for(cfg)
        ckpt = checkpointer_for(trainer, folder)
        assert (ckpt.resume() is not None) == resume
        if resume:  # the step after the checkpoint that was kept: iter 2, not the final iter 4
            assert trainer.step == 2 and trainer.batches.consumed_samples == 8
        try:
            trainer.train([ckpt])
        finally:
            trainer.close()
        return losses(folder)

    straight = run(tmp_path / "straight", resume=False)
    (tmp_path / "ckpt" / "iter_0000008").rename(tmp_path / "ckpt" / "ignored")
    (tmp_path / "ckpt" / "latest").write_text("iter_0000002")
    resumed = run(tmp_path / "resumed", resume=True)
    assert resumed == straight[2:]


def test_a_rerun_after_a_crash_before_any_checkpoint_logs_each_step_once(
    one_rank: None, tmp_path: Path
) -> None:
    """A job that died at step 3 with no checkpoint starts again from 0 in the same run folder:
    metrics.jsonl and TensorBoard hold each step once, the second job's values."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for max_steps in (3, 2):  # the second job dies too, earlier
        cfg = tiny(tmp_path, max_steps=max_steps)
        cfg.logging.tensorboard = True
        train(cfg)
    steps = [
        json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2]
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [1, 2]


# --- a data kind added by its own module and one registry entry ----------------------------------
class RepeatingBatches:
    """The throwaway kind's batch source: one fixed sequence, over and over."""

    def __init__(self, cfg: TrainingConfig, derived: Any) -> None:
        self.seq, self.micro = cfg.model.seq_length, cfg.train.micro_batch_size
        self.num_microbatches, self.gbs = derived.num_microbatches, cfg.train.global_batch_size
        self.consumed_samples = 0

    def next_step(self) -> list[dict[str, torch.Tensor]]:
        ids = torch.arange(self.seq + 1).repeat(self.micro, 1) % 7
        row = {
            "tokens": ids[:, :-1],
            "labels": ids[:, 1:],
            "loss_mask": torch.ones(self.micro, self.seq),
            "position_ids": torch.arange(self.seq).repeat(self.micro, 1),
        }
        self.consumed_samples += self.gbs
        return [row] * self.num_microbatches

    def state_dict(self) -> dict[str, Any]:
        return {"consumed_samples": self.consumed_samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.consumed_samples = int(state["consumed_samples"])


def repeating_batches(
    cfg: TrainingConfig, derived: Any, dp_rank: int, device: str, part: str
) -> RepeatingBatches:
    return RepeatingBatches(cfg, derived)


@pytest.fixture
def repeating_kind() -> Iterator[str]:
    # The one registry line a new kind needs (here added at run time, and taken back).
    register_data_kind(
        DataKind(
            name="repeating",
            source="tests.unit.training.test_engine:repeating_batches",
            summary="one sequence, repeated (a test's kind)",
            needs_path=False,
            needs_tokenizer=False,
            uses_split=False,
            has_validation=False,
            inputs=lambda path: [],
        )
    )
    yield "repeating"
    unregister_data_kind("repeating")


def test_a_new_data_kind_needs_its_module_and_one_registry_entry(
    one_rank: None, repeating_kind: str, tmp_path: Path
) -> None:
    from config.rules import validate
    from launchers.inputs import input_paths
    from training.entry import pretrain

    cfg = apply_overrides(tiny(tmp_path, max_steps=6), [f"data.kind={repeating_kind}"])
    assert validate(cfg, ONE_CPU) == []  # the checker knows it
    assert input_paths(cfg) == []  # so does the launcher's input check
    bad = apply_overrides(tiny(tmp_path), [f"data.kind={repeating_kind}", "train.eval_interval=2"])
    assert [p.field for p in validate(bad, ONE_CPU)] == ["train.eval_interval"]
    pretrain(cfg)  # and the engine trains on it
    trained = losses(tmp_path)
    assert len(trained) == 6 and trained[-1] < trained[0] - 1.0  # 7 ids, one sequence: learnt


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_the_gradient_norm_is_logged_with_clipping_off(
    one_rank: None, tmp_path: Path, fsdp: bool
) -> None:
    """optimizer.clip_grad=0 logs the norm that clipping would have measured: Megatron-Core's
    mixed-precision optimizer (Megatron-FSDP's) reports 0.0 when it does not clip."""
    logged = {}
    for clip in (1.0, 0.0):
        cfg = tiny(tmp_path / f"clip{clip}", max_steps=2)
        cfg.optimizer.clip_grad = clip
        cfg.parallel.use_megatron_fsdp = fsdp
        train(cfg)
        rows = (tmp_path / f"clip{clip}" / "metrics.jsonl").read_text().splitlines()
        logged[clip] = [json.loads(row)["grad_norm"] for row in rows]
    assert logged[0.0][0] > 0.5  # ~1.41 for this seed (a fresh tiny GPT)
    assert logged[0.0] == pytest.approx(logged[1.0], rel=1e-6)


class WeakHold:
    """Weak references to a run's model chunks and optimizer, taken after its first step."""

    def __init__(self) -> None:
        self.refs: list[weakref.ref] = []

    def after_step(self, trainer: Any, stopping: bool) -> None:
        self.refs = self.refs or [weakref.ref(o) for o in (*trainer.model, trainer.optimizer)]

    def at_end(self, trainer: Any) -> None:
        pass


def test_runs_in_one_process_leave_nothing_behind(one_rank: None, tmp_path: Path) -> None:
    """A 1-layer MoE, then a 3-layer one, through `pretrain` in one process (as run_many does):
    Megatron-Core's per-layer loss trackers must not keep the first model's size, and neither
    model nor optimizer outlives its run (the token dispatchers keep the last forward's autograd
    graph, which reaches DDP's hooks)."""
    from training.entry import pretrain

    for layers in (1, 3):
        cfg = tiny(tmp_path / f"moe{layers}", max_steps=2)
        cfg.model.num_layers = layers
        cfg.model.num_moe_experts, cfg.model.moe_router_topk = 4, 2
        cfg.model.moe_token_dispatcher_type = "allgather"  # the dispatcher the CPU runs
        held = WeakHold()
        pretrain(cfg, [held])
        assert len(losses(tmp_path / f"moe{layers}")) == 2
        assert held.refs and all(ref() is None for ref in held.refs)
        assert gc.get_freeze_count() == 0  # what the run froze is the collector's again
