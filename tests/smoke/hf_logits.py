"""One forward of a Hugging Face folder's weights in a multi-rank layout; rank 0 saves the logits.

    python -m torch.distributed.run --standalone --nproc-per-node W -m tests.smoke.hf_logits \\
        --config cfg.yaml --tokens tokens.pt --out logits.pt

Test helper (tests/smoke/test_gpt_oss_cpu.py): every rank builds the engine from the config (its
checkpoint.pretrained_dir a Hugging Face folder, its parallel section the layout) as
tests/support/hf_oracle.py does on one rank, loads the folder's slices, and runs the GPT chunk on
the same tokens (every rank: expert parallel exchanges tokens). The vocabulary-parallel logits of
the TP ranks are gathered; rank 0 writes [b, s, vocab] (padding rows cut off). One pipeline stage.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--tokens", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

    from config.hardware import Cluster
    from tests.support.hf_oracle import engine_from_hf
    from training import distributed
    from training.checkpoint.state import model_chunks
    from training.entry import load_config
    from training.ranks import launch_from_env

    launch = launch_from_env()
    distributed.init_process_group(launch, "cpu")
    cfg = load_config(str(args.config), [])
    cluster = Cluster(num_nodes=1, gpus_per_node=launch.world_size, gpu="cpu")
    trainer = engine_from_hf(cfg, Path(cfg.logging.run_dir), cluster)
    try:
        tokens = torch.load(args.tokens)
        chunk = model_chunks(trainer.model)["model"].eval()
        positions = torch.arange(tokens.size(1)).unsqueeze(0).expand_as(tokens)
        with torch.no_grad():
            logits = gather_from_tensor_model_parallel_region(chunk(tokens, positions, None))
        if launch.rank == 0:
            torch.save(logits[..., : cfg.model.vocab_size].contiguous(), args.out)
    finally:
        trainer.close()
        distributed.destroy()


if __name__ == "__main__":
    main()
