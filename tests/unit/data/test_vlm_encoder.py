"""The LLaVA task encoder (captioning, VQA, interleaved, packing) and the multimodal checker rules."""

from __future__ import annotations

import pytest
import torch
from megatron.energon import CaptioningSample, InterleavedSample, VQASample

from config.cost.memory import count_parameters, estimate_memory
from config.finalize import finalize
from config.hardware import Cluster
from config.rules import derive, validate
from data.tools.make_tokenizer import train_bpe_tokenizer
from data.vlm_encoder import IMAGE_TOKEN, EncoderConfig, VLMTaskEncoder, preprocess_image
from recipes.registry import get

WORDS = "a red blue green circle square on the white black background what colour is it".split()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 20
    return str(train_bpe_tokenizer(vocab_size=320, out=out, texts=texts))


def _encoder(tokenizer: str, seq_length: int = 48, image_tokens: int = 5) -> VLMTaskEncoder:
    return VLMTaskEncoder(EncoderConfig(tokenizer, seq_length, 16, image_tokens))


def _base(key: str) -> dict:
    return {"__key__": key, "__restore_key__": (), "__subflavors__": None, "__sources__": None}


def _image() -> torch.Tensor:
    return torch.rand(3, 24, 32)


def test_preprocess_pads_to_a_square_and_resizes() -> None:
    out = preprocess_image(torch.rand(3, 24, 32), 16)
    assert out.shape == (3, 16, 16) and out.dtype == torch.float32


def test_captioning(tokenizer: str) -> None:
    enc = _encoder(tokenizer)
    s = enc.encode_sample(CaptioningSample(**_base("k"), image=_image(), caption="a red circle"))
    ids, targets = s.ids.tolist(), s.targets.tolist()
    assert ids[0] == IMAGE_TOKEN and not targets[0]
    assert ids[-1] == enc.tokenizer.eod and all(targets[1:])
    assert enc.tokenizer.detokenize(ids[1:-1]) == "a red circle"
    assert len(s.images) == 1 and s.images[0].shape == (3, 16, 16)


def test_vqa_trains_on_the_best_answer_only(tokenizer: str) -> None:
    enc = _encoder(tokenizer)
    sample = VQASample(
        **_base("q"),
        image=_image(),
        context="what colour is it",
        answers=["blue", "red"],
        answer_weights=torch.tensor([0.2, 0.8]),
    )
    s = enc.encode_sample(sample)
    answer = [i for i, t in zip(s.ids.tolist(), s.targets.tolist(), strict=True) if t]
    assert enc.tokenizer.detokenize(answer[:-1]) == "red" and answer[-1] == enc.tokenizer.eod


def test_interleaved_and_truncation_never_cuts_an_image(tokenizer: str) -> None:
    enc = _encoder(tokenizer, seq_length=20, image_tokens=8)
    seq = ["the red circle", _image(), "on the white background", _image(), "a blue square"]
    s = enc.encode_sample(InterleavedSample(**_base("i"), sequence=seq))
    assert s.ids.tolist().count(IMAGE_TOKEN) == len(s.images)
    assert enc.positions(s) <= 20
    full = _encoder(tokenizer, seq_length=200, image_tokens=8)
    whole = full.encode_sample(InterleavedSample(**_base("i"), sequence=seq))
    assert len(whole.images) == 2 and len(s.images) < 2  # the second image did not fit, whole


def test_packing_keeps_every_sample_within_seq_length(tokenizer: str) -> None:
    enc = _encoder(tokenizer, seq_length=48)
    captions = ["a red circle", "on the white background", "a blue square on black", "it"] * 3
    samples = [
        enc.encode_sample(CaptioningSample(**_base(str(i)), image=_image(), caption=c))
        for i, c in enumerate(captions)
    ]
    rows = enc.select_samples_to_pack(samples)
    assert sorted(s.__key__ for row in rows for s in row) == sorted(s.__key__ for s in samples)
    packed = [enc.pack_selected_samples(row) for row in rows]
    assert all(enc.positions(p) <= 48 for p in packed)
    assert len(packed) < len(samples)  # something was packed
    batch = enc.batch(packed[:2])
    assert batch.images.shape[0] == sum(len(p.images) for p in packed[:2])
    assert batch.__key__[0] == packed[0].__key__ and "," in batch.__key__[0]


def test_batch_shifts_labels_and_masks_padding(tokenizer: str) -> None:
    enc = _encoder(tokenizer)
    short = enc.encode_sample(CaptioningSample(**_base("a"), image=_image(), caption="it"))
    long = enc.encode_sample(
        CaptioningSample(
            **_base("b"), image=_image(), caption="a red circle on the black background"
        )
    )
    batch = enc.batch([short, long])
    n = len(short.ids) - 1
    assert batch.tokens.shape == batch.labels.shape == batch.loss_mask.shape
    assert batch.tokens[0, :n].tolist() == short.ids[:-1].tolist()
    assert batch.labels[0, :n].tolist() == short.ids[1:].tolist()
    assert batch.loss_mask[0, n:].sum() == 0  # padding
    assert batch.loss_mask[0, :n].tolist() == short.targets[1:].float().tolist()
    # LLaVAModel expands each placeholder to image_tokens positions.
    assert batch.num_tokens.tolist() == [enc.positions(short), enc.positions(long)]


# --- the checker ------------------------------------------------------------------------------
def _problems(name: str, **overrides) -> list[tuple[str, str]]:
    recipe = get(name)
    cfg = recipe.config()
    cluster = overrides.pop("cluster", recipe.cluster)
    for path, value in overrides.items():
        node = cfg
        *parents, leaf = path.split("__")
        for part in parents:
            node = getattr(node, part)
        setattr(node, leaf, value)
    return [(p.field, p.message) for p in validate(cfg, cluster, finalize(cfg, cluster))]


def test_image_tokens_must_fit_the_sequence() -> None:
    assert _problems("tiny_llava_pretrain", model__seq_length=18) == []  # 16 patches + class + 1
    fields = [f for f, m in _problems("tiny_llava_pretrain", model__seq_length=17)]
    assert fields == ["model.seq_length"]
    message = _problems("llava_llama3_8b_pretrain", model__seq_length=512)[0][1]
    assert "(336/14)^2 = 576 patches + 1 class token = 577" in message


def test_vision_heads_and_pipeline_rules() -> None:
    problems = _problems(
        "tiny_llava_pretrain",
        model__vision__num_attention_heads=1,
        parallel__tensor_model_parallel_size=2,
    )
    assert any(
        "model.vision.num_attention_heads=1 is not divisible by TP=2" in m for _, m in problems
    )
    problems = _problems("tiny_llava_pretrain", parallel__pipeline_model_parallel_size=2)
    assert [f for f, _ in problems] == ["parallel.pipeline_model_parallel_size"]
    problems = _problems("tiny_llava_pretrain", model__vision__image_size=30)
    assert ("model.vision.image_size") in [f for f, _ in problems]


def test_data_kind_and_arch_go_together() -> None:
    assert [f for f, _ in _problems("tiny_llava_pretrain", data__kind="mock")] == ["data.kind"]
    # (a GPT on Energon data: the kind's tokenizer is missing too)
    gpt_on_images = _problems("tiny_gpt_pretrain", data__kind="energon", data__path="x")
    assert [f for f, _ in gpt_on_images] == ["data.tokenizer", "data.kind"]
    assert [f for f, _ in _problems("tiny_llava_pretrain", data__tokenizer=None)] == [
        "data.tokenizer"
    ]


def test_estimate_counts_the_vision_encoder_and_frozen_parts() -> None:
    cfg = get("llava_llama3_8b_pretrain").config()
    # openai/clip-vit-large-patch14-336 vision tower (303.5M) + the 2-layer projector (21.0M).
    assert count_parameters(cfg).vision / 1e6 == pytest.approx(324.5, rel=0.01)
    cluster = Cluster(num_nodes=1, gpus_per_node=8, gpu="h100")
    frozen = estimate_memory(cfg, cluster, derive(cfg, cluster))
    cfg.model.vision.freeze_language = cfg.model.vision.freeze_vision = False
    trained = estimate_memory(cfg, cluster, derive(cfg, cluster))
    # Frozen weights hold no gradient and no optimizer state.
    assert frozen.gradients_gib < 0.1 < trained.gradients_gib
    assert frozen.total_gib < trained.total_gib


def test_energon_names_a_missing_vision_section_or_path() -> None:
    """Called without the checker: a clear error naming the field, not a failure on None inside."""
    from data.energon import build_loader, encoder_config

    cfg = get("tiny_llava_pretrain").config()
    cfg.data.tokenizer, cfg.model.vision = "tokenizer.json", None
    with pytest.raises(ValueError, match=r"needs model\.vision"):
        encoder_config(cfg)
    cfg = get("tiny_llava_pretrain").config()
    cfg.data.path = None
    with pytest.raises(ValueError, match=r"needs data\.path"):
        build_loader(cfg, 0, 1)
