"""A small synthetic captioning set: coloured shapes on plain backgrounds, captions that name them.

    recipes data make-synthetic-vlm OUT [--samples 512] [--image-size 64] [--seed 0]

Each image shows one shape (circle, square, triangle, cross) of one colour, in one of four
places, on a background of another colour; its caption names all four: "a small red circle at the
top left on a blue background". The caption follows from the pixels, so a vision-language model
can learn it (the loss falls well below that of guessing the words), and tests and demos need no
download. The images go through the same path as real data (`data.tools.vlm_prepare`: folder of
image + .txt -> shards -> `energon prepare`), and a byte-level BPE tokenizer trained on the
captions is written next to them as OUT/tokenizer.json, for data.tokenizer.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from data.tools.vlm_prepare import PrepareReport, prepare_captions

COLORS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 210, 40),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
SHAPES = ("circle", "square", "triangle", "cross")
PLACES = {"top left": (0, 0), "top right": (1, 0), "bottom left": (0, 1), "bottom right": (1, 1)}
SIZES = {"small": 0.3, "large": 0.45}
TOKENIZER = "tokenizer.json"


def _draw(size: int, shape: str, color: str, background: str, place: str, scale: str):  # -> Image
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), COLORS[background])
    draw = ImageDraw.Draw(image)
    half, extent = size // 2, int(size * SIZES[scale])
    col, row = PLACES[place]
    cx, cy = col * half + half // 2, row * half + half // 2
    r = extent // 2
    box = (cx - r, cy - r, cx + r, cy + r)
    fill = COLORS[color]
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    elif shape == "triangle":
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)
    else:  # cross
        w = max(1, r // 3)
        draw.rectangle((cx - r, cy - w, cx + r, cy + w), fill=fill)
        draw.rectangle((cx - w, cy - r, cx + w, cy + r), fill=fill)
    return image


def write_images(folder: Path, samples: int, image_size: int, seed: int) -> list[str]:
    """`samples` PNG images with same-name .txt captions in `folder`; returns the captions."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    captions = []
    for i in range(samples):
        color, background = rng.sample(sorted(COLORS), 2)
        shape, place, scale = (
            rng.choice(SHAPES),
            rng.choice(sorted(PLACES)),
            rng.choice(sorted(SIZES)),
        )
        image = _draw(image_size, shape, color, background, place, scale)
        caption = f"a {scale} {color} {shape} at the {place} on a {background} background"
        image.save(folder / f"{i:06d}.png")
        (folder / f"{i:06d}.txt").write_text(caption + "\n", encoding="utf-8")
        captions.append(caption)
    return captions


def make_synthetic_vlm(
    out: str | Path,
    *,
    samples: int = 512,
    image_size: int = 64,
    seed: int = 0,
    vocab_size: int = 384,
    shard_size: int = 128,
    log: bool = True,
) -> PrepareReport:
    """Generate, shard and prepare the set under `out`, with `out`/tokenizer.json."""
    from data.tools.make_tokenizer import train_bpe_tokenizer

    if samples < 1:
        raise ValueError(f"--samples must be at least 1, got {samples}")
    out = Path(out)
    with tempfile.TemporaryDirectory(prefix="synthetic-vlm-") as tmp:
        captions = write_images(Path(tmp), samples, image_size, seed)
        report = prepare_captions(tmp, out, on_error="stop", shard_size=shard_size, log=log)
    # Byte-level BPE on the captions: a few dozen words, so most merges become whole words.
    train_bpe_tokenizer(vocab_size=vocab_size, out=out / TOKENIZER, texts=captions)
    return report
