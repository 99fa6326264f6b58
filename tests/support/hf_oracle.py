"""transformers as the oracle: tiny random Hugging Face models made on the spot, and our engine's
logits for the same tokens after loading them through `checkpoint.pretrained_dir`.

`engine_from_hf(folder, run_dir)` builds a Trainer on the current (one-rank) process group from the
folder's config.json (precision fp32), loads the folder's weights through the Checkpointer and
returns the trainer; `gpt_logits(trainer, tokens)` runs the GPT chunk forward without labels.
Multi-rank layouts run the same through tests/smoke/hf_logits.py under torchrun.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from config.finalize import complete, finalize, missing
from config.hardware import Cluster
from config.hf import model_from_hf
from config.schema import (
    CheckpointConfig,
    DataConfig,
    LoggingConfig,
    ParallelConfig,
    TrainConfig,
    TrainingConfig,
)

ONE_CPU = Cluster(num_nodes=1, gpus_per_node=1, gpu="cpu")


def hf_config(folder: Path, run_dir: Path, seq_length: int = 32, **parallel: Any) -> TrainingConfig:
    model = model_from_hf(folder, seq_length=seq_length)
    if model.num_moe_experts:
        model.moe_token_dispatcher_type = "allgather"  # the one that runs over gloo
        model.moe_aux_loss_coeff = 0.0
    return TrainingConfig(
        name="hf",
        model=model,
        precision="fp32",
        parallel=ParallelConfig(**parallel),
        train=TrainConfig(global_batch_size=2, micro_batch_size=1, max_steps=1, device="cpu"),
        checkpoint=CheckpointConfig(pretrained_dir=str(folder), save_interval=1000, keep_last=0),
        logging=LoggingConfig(run_dir=str(run_dir), tensorboard=False, progress_bar=False),
        data=DataConfig(kind="mock"),
    )


def engine_from_hf(cfg: TrainingConfig, run_dir: Path, cluster: Cluster = ONE_CPU) -> Any:
    """A Trainer with the folder's weights loaded (the process group must exist)."""
    from training.checkpoint.store import Checkpointer
    from training.engine import Trainer

    # Unchecked on purpose: a LLaVA oracle runs on mock data, which the checker refuses for want of
    # images, and a folder that does not match the config is the Checkpointer's to refuse here.
    partial = finalize(cfg, cluster)
    derived = complete(partial)
    if derived is None:
        raise ValueError(f"{cfg.name} derives no {', '.join(missing(partial))} on {cluster}")
    trainer = Trainer(cfg, derived, "cpu", run_dir)
    checkpointer = Checkpointer(
        cfg,
        run_dir,
        "cpu",
        model=trainer.model,
        optimizer=trainer.optimizer,
        states=trainer.checkpoint_states(),
    )
    checkpointer.resume()
    checkpointer.close()
    return trainer


@torch.no_grad()
def gpt_logits(trainer: Any, tokens: torch.Tensor) -> torch.Tensor:
    """[b, s, vocab] logits of a one-rank GPT (padding rows of the vocabulary cut off)."""
    from training.checkpoint.state import model_chunks

    chunk = model_chunks(trainer.model)["model"].eval()
    positions = torch.arange(tokens.size(1)).unsqueeze(0).expand_as(tokens)
    logits = chunk(tokens, positions, None)
    chunk.train()
    return logits[..., : trainer.cfg.model.vocab_size]
