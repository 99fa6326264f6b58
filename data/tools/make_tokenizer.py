"""Train a small byte-level BPE tokenizer.json on local text (for test data and demos).

    python -m data.tools.make_tokenizer --vocab-size 512 --out tok.json input.txt [more.txt ...]

Byte-level (GPT-2 style): every byte is in the base alphabet, so any text encodes without unknown
tokens and decodes back exactly. `<|endoftext|>` is added as a special token with id 0 so that
`data.tokenizer.load_tokenizer` finds the end-of-document token.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

EOD = "<|endoftext|>"
BYTE_ALPHABET = 256  # byte-level BPE starts from every byte


def train_bpe_tokenizer(
    files: Sequence[str | Path] = (),
    *,
    vocab_size: int,
    out: str | Path,
    texts: Iterable[str] | None = None,
    special_tokens: Sequence[str] = (EOD,),
) -> Path:
    """Train a byte-level BPE on `files` or on an iterable of `texts`; save it to `out`.

    The resulting vocabulary can be smaller than `vocab_size` when the text has fewer distinct
    merges; the saved file is what counts (`Tokenizer.get_vocab_size()`).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    minimum = BYTE_ALPHABET + len(special_tokens)
    if vocab_size < minimum:
        raise ValueError(
            f"--vocab-size {vocab_size} is below the byte alphabet plus special tokens "
            f"({BYTE_ALPHABET} + {len(special_tokens)} = {minimum})"
        )
    for f in files:
        if not Path(f).is_file():
            raise FileNotFoundError(f"input text {f} does not exist")
    if bool(files) == (texts is not None):
        # A second train() call would start over, so the two sources are not mixed.
        raise ValueError("give either input files or texts to train on")

    tok = Tokenizer(models.BPE())
    # No prefix space: documents are concatenated as they are, as GPT-2 does.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),  # ids 0.. in this order
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    if files:
        tok.train([str(f) for f in files], trainer)
    else:
        tok.train_from_iterator(texts, trainer)

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m data.tools.make_tokenizer", description=__doc__.split("\n")[0]
    )
    parser.add_argument("inputs", nargs="+", help="plain-text files to train on")
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--out", required=True, help="where to write tokenizer.json")
    args = parser.parse_args(argv)
    try:
        out = train_bpe_tokenizer(args.inputs, vocab_size=args.vocab_size, out=args.out)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from tokenizers import Tokenizer

    print(f"wrote {out} (vocabulary {Tokenizer.from_file(str(out)).get_vocab_size()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
