"""Trained here, read there: a model started from a Hugging Face folder, changed by training,
exported with `recipes export`, gives the same logits in transformers as in our engine.

One test per kind of map: Llama (dense, stacked layer keys), Qwen3-MoE (experts, per-layer keys),
DeepSeek-V3 (MLA, shared experts, grouped sigmoid routing whose expert bias training moves) and
LLaVA (CLIP ViT, projector, language model). The GPT families train a few steps on mock data; the
LLaVA model's weights are moved by hand (its training needs an Energon dataset, which
tests/smoke/test_llava_cpu.py covers), so that an export of the original folder could not pass.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from recipes.cli import main
from tests.support.hf_oracle import engine_from_hf, gpt_logits, hf_config
from tests.unit.training.test_engine import (  # noqa: F401 (one_rank: the module's process group)
    checkpointer_for,
    one_rank,
)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_rank")


def make(family: str, folder: Path) -> torch.nn.Module:
    if family == "llama":
        from tests.unit.models.test_hf_llama import tiny_llama

        return tiny_llama(folder)
    from tests.unit.models.test_hf_families import tiny

    return tiny(family, folder)


@pytest.mark.parametrize("family", ["llama", "qwen3_moe", "deepseek_v3"])
def test_a_model_trained_from_a_folder_exports_what_transformers_computes(
    tmp_path: Path, family: str
) -> None:
    from tests.unit.models.test_hf_families import TOKENS

    original = make(family, tmp_path / "hf")
    cfg = hf_config(tmp_path / "hf", tmp_path / "run")
    cfg.train.max_steps = 3
    cfg.scheduler.warmup_steps = 1
    cfg.optimizer.lr = 1e-2
    trainer = engine_from_hf(cfg, tmp_path / "run")
    try:
        checkpointer = checkpointer_for(trainer, tmp_path / "run")
        trainer.train(hooks=[checkpointer])
        checkpointer.close()
        ours = gpt_logits(trainer, TOKENS)
    finally:
        trainer.close()
    assert main(["export", str(tmp_path / "run" / "checkpoints"), str(tmp_path / "out")]) == 0
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        theirs, before = exported(TOKENS).logits, original(TOKENS).logits
    assert (theirs - before).abs().max() > 1e-2  # training moved the model
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_a_changed_llava_exports_what_transformers_computes(tmp_path: Path) -> None:
    from tests.unit.models.test_hf_llava import as_on_the_hub, inputs, llava_logits, tiny_llava
    from training.checkpoint.state import model_chunks

    original = tiny_llava(tmp_path / "hf")
    as_on_the_hub(tmp_path / "hf")
    cfg = hf_config(tmp_path / "hf", tmp_path / "run", seq_length=64)
    # A save before any optimizer step: the distributed optimizer has no state to shard yet.
    cfg.optimizer.use_distributed_optimizer = False
    trainer = engine_from_hf(cfg, tmp_path / "run")
    try:
        generator = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for param in model_chunks(trainer.model)["model"].parameters():
                param.add_(0.05 * torch.randn(param.shape, generator=generator))
        checkpointer = checkpointer_for(trainer, tmp_path / "run")
        checkpointer.save()
        checkpointer.close()
        ours_tokens, their_tokens, image = inputs(16)
        ours = llava_logits(trainer, ours_tokens, image)
    finally:
        trainer.close()
    assert main(["export", str(tmp_path / "run" / "checkpoints"), str(tmp_path / "out")]) == 0
    exported = transformers.LlavaForConditionalGeneration.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        theirs = exported(input_ids=their_tokens, pixel_values=image).logits
        before = original(input_ids=their_tokens, pixel_values=image).logits
    assert (theirs - before).abs().max() > 1e-2
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
