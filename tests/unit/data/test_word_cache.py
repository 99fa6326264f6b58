"""The word-cache encoder (data/tools/word_cache.py) against the `tokenizers` library itself: the
same split on every assigned code point, the same ids on mixed-script text for GPT-2's, Llama 3's
and Qwen2's kinds of tokenizer, and no encoder (the library instead) for any other kind."""

from __future__ import annotations

import random
import unicodedata

import pytest
import regex
from tokenizers import (
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from data.tools.word_cache import BYTE_CHARS, GPT2_SPLIT, ascii_pattern, word_encoder

# Llama 3's and Qwen2's split expressions, as their tokenizer.json files publish them.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SCRIPTS = [
    "The quick brown fox's jumping, isn't it? 12345 67.89",
    "Grüße aus Jülich: Ärger, Öl, naïve café, ÉCOLE",
    "Ελληνικά κείμενα και русский текст",
    "中文分词没有空格。日本語のテキスト、한국어 텍스트",
    "عربى هندی हिन्दी ไทย",
    "emoji 👩‍🔬🚀✨ and\u00a0nbsp\u2028\u3000 ideographic",
    "def f(x):\n    return x ** 2  # comment\n\t\ttabs\r\n\r\n",
]


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = [rng.choice(SCRIPTS) for _ in range(rng.randint(1, 6))]
        text = rng.choice([" ", "  ", "\n", "", "\t "]).join(parts)
        if rng.random() < 0.1:
            text += "<|endoftext|>" + rng.choice(SCRIPTS)  # an added token inside a text
        if rng.random() < 0.05:
            text += " ab\u0558cd"  # a letter assigned after Python 3.12's Unicode 15.0
        out.append(text[: rng.randint(0, len(text))] if rng.random() < 0.2 else text)
    return out


def _tokenizer(split: str | None, *, nfc: bool = False, bos: bool = False) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])  # fmt: skip
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>", "<|begin_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_texts(300, seed=1), trainer)
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 1)]
        )
    return tok


@pytest.mark.parametrize(
    ("split", "nfc", "bos"),
    [(None, False, False), (LLAMA3_SPLIT, False, True), (QWEN2_SPLIT, True, False)],
    ids=["gpt2", "llama3", "qwen2"],
)
def test_the_ids_are_the_librarys(split: str | None, nfc: bool, bos: bool) -> None:
    tok = _tokenizer(split, nfc=nfc, bos=bos)
    encoder, why = word_encoder(tok)
    assert encoder is not None, why
    texts = _texts(400, seed=2)
    ids = encoder(texts)
    assert ids == [e.ids for e in tok.encode_batch(texts)]
    assert ids == encoder(texts)  # the second time from the cache
    if bos:
        assert all(i[:1] == [1] for i in ids)


def test_other_kinds_of_tokenizer_get_no_word_cache() -> None:
    sentencepiece_like = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    sentencepiece_like.pre_tokenizer = pre_tokenizers.Metaspace()
    assert word_encoder(sentencepiece_like) == (
        None,
        "its BPE falls back to bytes (a sentencepiece-style BPE)",
    )
    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    assert word_encoder(wordpiece)[0] is None
    lowercase = _tokenizer(None)
    lowercase.normalizer = normalizers.Lowercase()
    assert word_encoder(lowercase) == (None, "its normalizer is Lowercase")
    dropout = _tokenizer(None)
    dropout.model.dropout = 0.1
    assert word_encoder(dropout)[0] is None


@pytest.mark.parametrize("split", [None, LLAMA3_SPLIT], ids=["gpt2", "llama3"])
def test_every_assigned_code_point_is_split_as_the_library_splits_it(split: str | None) -> None:
    """Each code point Python's Unicode tables assign, in contexts that exercise each class of
    the expression (letters, digits, whitespace, the rest, contractions), split alike by the
    `regex` module and by the library's pre-tokenizer; the unassigned ones are left to the
    library (word_cache.unassigned)."""
    if split is None:
        library = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        back = {c: b for b, c in enumerate(BYTE_CHARS)}

        def theirs(s: str) -> list[str]:
            return [bytes(back[c] for c in w).decode() for w, _ in library.pre_tokenize_str(s)]

        ours = regex.compile(GPT2_SPLIT).findall
    else:
        splitter = pre_tokenizers.Split(Regex(split), behavior="isolated")

        def theirs(s: str) -> list[str]:
            return [w for w, _ in splitter.pre_tokenize_str(s)]

        ours = regex.compile(split).findall
    assigned = [
        chr(c)
        for c in range(0x110000)
        if not 0xD800 <= c < 0xE000 and unicodedata.category(chr(c)) != "Cn"
    ]
    for start in range(0, len(assigned), 8192):
        text = "".join(
            f"a{ch}b {ch}{ch} x{ch}\n{ch}'s 1{ch}2  {ch}" for ch in assigned[start : start + 8192]
        )
        if ours(text) != theirs(text):
            for ch in assigned[start : start + 8192]:  # name the first code point that differs
                one = f"a{ch}b {ch}{ch} x{ch}\n{ch}'s 1{ch}2  {ch}"
                assert ours(one) == theirs(one), f"U+{ord(ch):04X}"
            pytest.fail(f"the code points from U+{ord(assigned[start]):04X} split apart together")


def test_a_letter_newer_than_pythons_unicode_is_left_to_the_library() -> None:
    """U+0558 (Armenian, Unicode 16): a letter to the `regex` module, not to the library's
    Oniguruma, so the two split the word differently; the text goes to the library whole."""
    text = "Grüße ab\u0558cd"
    library = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert len(regex.findall(GPT2_SPLIT, text)) != len(library.pre_tokenize_str(text))
    tok = _tokenizer(None)
    encoder, _ = word_encoder(tok)
    asked: list[str] = []

    class Spy:
        def encode(self, t: str) -> object:
            asked.append(t)
            return tok.encode(t)

    encoder.backend = Spy()
    assert encoder([text, "Grüße"]) == [tok.encode(text).ids, tok.encode("Grüße").ids]
    assert asked == [text]


@pytest.mark.parametrize(
    "split", [GPT2_SPLIT, LLAMA3_SPLIT, QWEN2_SPLIT], ids=["gpt2", "llama3", "qwen2"]
)
def test_the_ascii_split_is_the_librarys(split: str) -> None:
    """ASCII-only text takes stdlib `re` with ASCII classes: every ASCII character in the
    contexts above, and random ASCII strings, split as the library splits them."""
    import re

    fast = re.compile(ascii_pattern(split)).findall
    library = pre_tokenizers.Split(Regex(split), behavior="isolated")
    rng = random.Random(3)
    texts = [f"a{ch}b {ch}{ch} x{ch}\n{ch}'s 1{ch}2  {ch}" for ch in map(chr, range(128))]
    pool = "".join(map(chr, range(128))) + "   \n\n\t'sSlLdD0123456789"
    texts += ["".join(rng.choice(pool) for _ in range(rng.randint(0, 60))) for _ in range(5000)]
    for text in texts:
        assert fast(text) == [w for w, _ in library.pre_tokenize_str(text)], repr(text)


def test_the_ascii_pattern_refuses_what_it_cannot_translate() -> None:
    assert ascii_pattern(r"\p{Lu}+|\s+") is None
    assert ascii_pattern(r"[\S]+") is None
    assert ascii_pattern(r"\w+") is None
