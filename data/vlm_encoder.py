"""Energon task encoder: captioning, VQA and interleaved samples -> LLaVA training batches.

Each sample becomes one token sequence x with an image placeholder (IMAGE_TOKEN, Megatron's
LLaVAModel default -200) wherever an image goes, and a flag per element saying whether predicting
it counts in the loss:

    captioning   [IMG] caption <eod>                     loss on caption and <eod>
    VQA          [IMG] question "\\n" answer <eod>        loss on answer and <eod>
    interleaved  text [IMG] text [IMG] ... <eod>          loss on every text token and <eod>

A batch row holds tokens = x[:-1], labels = x[1:] and loss_mask = flags[1:], padded with zeros to
the longest row of the microbatch; the images of all rows are stacked in row order. LLaVAModel
replaces each placeholder by the image's `image_tokens` embeddings, so a row takes
len(x) - 1 + images x (image_tokens - 1) positions of the language model, which the encoder keeps
within model.seq_length by cutting text at the end (never an image).

Packing (data.sequence_packing) concatenates whole samples into one row up to model.seq_length,
first-fit decreasing over a buffer of samples. Without Transformer Engine there is no attention
mask between the packed samples (each attends to those before it in the row), as in GPT
pretraining on concatenated documents; the loss of every sample is still its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from megatron.energon import (
    Batch,
    CaptioningSample,
    DefaultTaskEncoder,
    InterleavedSample,
    Sample,
    VQASample,
    edataclass,
    stateless,
)

IMAGE_TOKEN = -200  # megatron.core.models.multimodal.llava_model.DEFAULT_IMAGE_TOKEN_INDEX
# CLIP's pixel statistics (OpenAI CLIP ViT-L/14-336), which the LLaVA encoders were trained with.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True, slots=True)
class EncoderConfig:
    tokenizer: str  # local tokenizer.json or HF folder (data.tokenizer)
    seq_length: int  # language-model positions per row (model.seq_length)
    image_size: int  # square input of the vision encoder (model.vision.image_size)
    image_tokens: int  # LM positions one image takes (patches, plus the class token if kept)


@edataclass
class VLMSample(Sample):
    ids: torch.Tensor  # [n] the sequence x, IMAGE_TOKEN at image places
    targets: torch.Tensor  # [n] bool: predicting x[i] counts in the loss
    images: list[torch.Tensor]  # [3, S, S] each, normalised, in placeholder order


@edataclass
class VLMBatch(Batch):
    images: torch.Tensor  # [num_images, 3, S, S]
    tokens: torch.Tensor  # [b, s] long
    labels: torch.Tensor  # [b, s] long
    loss_mask: torch.Tensor  # [b, s] float
    num_tokens: torch.Tensor  # [b] LM positions each row really uses (the rest is padding)


def preprocess_image(image: torch.Tensor, size: int) -> torch.Tensor:
    """[3, H, W] in [0, 1] -> [3, size, size]: padded to a square with the mean colour (LLaVA-1.5's
    "pad" aspect mode, nothing is cropped away), resized, normalised with CLIP's statistics."""
    mean = torch.tensor(CLIP_MEAN).view(3, 1, 1)
    std = torch.tensor(CLIP_STD).view(3, 1, 1)
    _, h, w = image.shape
    if h != w:
        side = max(h, w)
        square = mean.expand(3, side, side).clone()
        top, left = (side - h) // 2, (side - w) // 2
        square[:, top : top + h, left : left + w] = image
        image = square
    if image.shape[-1] != size:
        image = F.interpolate(image[None], size=(size, size), mode="bilinear", antialias=True)[0]
    return ((image - mean) / std).float()


class VLMTaskEncoder(DefaultTaskEncoder[Sample, VLMSample, VLMBatch, VLMBatch]):
    """Captioning / VQA / interleaved samples to VLMBatch; packs rows when packing is on."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self._tokenizer = None  # loaded in each worker on first use (Rust tokenizers and fork)

    @property
    def tokenizer(self):  # -> data.tokenizer.LocalTokenizer
        if self._tokenizer is None:
            from data.tokenizer import load_tokenizer

            self._tokenizer = load_tokenizer(self.config.tokenizer)
        return self._tokenizer

    def _text(self, text: str) -> list[int]:
        ids = self.tokenizer.tokenize(text)
        bos = self.tokenizer.bos
        return ids[1:] if bos is not None and ids[:1] == [bos] else ids  # one BOS per sequence

    def _sequence(self, parts: list[tuple[str | torch.Tensor, bool]]) -> tuple[list, list, list]:
        """(ids, targets, images) from (text or image, is loss target) parts, BOS first, EOD last."""
        bos = self.tokenizer.bos
        ids, targets, images = ([bos], [False], []) if bos is not None else ([], [], [])
        for part, target in parts:
            if isinstance(part, torch.Tensor):
                ids.append(IMAGE_TOKEN)
                targets.append(False)
                images.append(part)
            else:
                piece = self._text(part)
                ids += piece
                targets += [target] * len(piece)
        ids.append(self.tokenizer.eod)
        targets.append(True)
        return ids, targets, images

    def _fit(self, ids: list, targets: list, images: list) -> tuple[list, list, list]:
        """Cut text at the end so the row fits seq_length; an image is never cut in half."""
        extra = self.config.image_tokens - 1
        budget = self.config.seq_length + 1  # x is one longer than the tokens the LM sees
        used, n_images, keep = 0, 0, 0
        for token in ids:
            cost = 1 + (extra if token == IMAGE_TOKEN else 0)
            if used + cost > budget:
                break
            used, keep = used + cost, keep + 1
            n_images += token == IMAGE_TOKEN
        if keep < 2:
            raise ValueError(
                f"a sample does not fit model.seq_length={self.config.seq_length} with "
                f"{self.config.image_tokens} positions per image"
            )
        return ids[:keep], targets[:keep], images[:n_images]

    @stateless
    def encode_sample(self, sample: Sample) -> VLMSample:
        size = self.config.image_size
        if isinstance(sample, CaptioningSample):
            parts = [(preprocess_image(sample.image, size), False), (sample.caption.strip(), True)]
        elif isinstance(sample, VQASample):
            answers = sample.answers or [""]
            best = (
                int(torch.argmax(sample.answer_weights)) if sample.answer_weights is not None else 0
            )
            parts = [
                (preprocess_image(sample.image, size), False),
                (sample.context.strip() + "\n", False),
                (answers[best].strip(), True),
            ]
        elif isinstance(sample, InterleavedSample):
            parts = [
                (preprocess_image(p, size) if isinstance(p, torch.Tensor) else p, True)
                for p in sample.sequence
            ]
        else:
            raise TypeError(
                f"{type(sample).__name__} ({sample.__key__}) is not a CaptioningSample, VQASample or "
                "InterleavedSample; set sample_type in the dataset's .nv-meta/dataset.yaml"
            )
        ids, targets, images = self._fit(*self._sequence(parts))
        return VLMSample.derive_from(
            sample,
            ids=torch.tensor(ids, dtype=torch.long),
            targets=torch.tensor(targets, dtype=torch.bool),
            images=images,
        )

    def positions(self, sample: VLMSample) -> int:
        """Language-model positions the sample takes in a row (its tokens, images expanded)."""
        return len(sample.ids) - 1 + len(sample.images) * (self.config.image_tokens - 1)

    def select_samples_to_pack(self, samples: list[VLMSample]) -> list[list[VLMSample]]:
        """First-fit decreasing into rows of at most seq_length positions (+1: x is one longer)."""
        rows: list[list[VLMSample]] = []
        room: list[int] = []
        for sample in sorted(samples, key=self.positions, reverse=True):
            need = self.positions(sample) + 1
            slot = next((i for i, r in enumerate(room) if r >= need), None)
            if slot is None:
                rows.append([sample])
                room.append(self.config.seq_length + 1 - need)
            else:
                rows[slot].append(sample)
                room[slot] -= need
        return rows

    @stateless
    def pack_selected_samples(self, samples: list[VLMSample]) -> VLMSample:
        return VLMSample.derive_from(
            samples[0],
            __key__=",".join(s.__key__ for s in samples),
            ids=torch.cat([s.ids for s in samples]),
            targets=torch.cat([s.targets for s in samples]),
            images=[image for s in samples for image in s.images],
        )

    @stateless
    def batch(self, samples: list[VLMSample]) -> VLMBatch:
        width = max(len(s.ids) - 1 for s in samples)
        tokens = torch.zeros(len(samples), width, dtype=torch.long)
        labels = torch.zeros_like(tokens)
        loss_mask = torch.zeros(len(samples), width, dtype=torch.float)
        for row, s in enumerate(samples):
            n = len(s.ids) - 1
            tokens[row, :n], labels[row, :n] = s.ids[:-1], s.ids[1:]
            loss_mask[row, :n] = s.targets[1:].float()
        images = [image for s in samples for image in s.images]
        size = self.config.image_size
        return VLMBatch(
            __key__=[s.__key__ for s in samples],
            __restore_key__=(),
            # Where each sample came from (dataset, shard, file names): blends and debugging.
            __sources__=tuple(src for s in samples for src in (s.__sources__ or ())),
            images=torch.stack(images) if images else torch.zeros(0, 3, size, size),
            tokens=tokens,
            labels=labels,
            loss_mask=loss_mask,
            num_tokens=torch.tensor([self.positions(s) for s in samples]),
        )
