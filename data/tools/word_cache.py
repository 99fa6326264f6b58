"""Byte-level BPE tokenizers encoded a word at a time, each distinct word once.

A byte-level BPE tokenizer (GPT-2's kind: Llama 3, Qwen2/2.5/3, GPT-OSS, Mistral's Tekken, most
tokenizers trained with the `tokenizers` library) encodes a text in four steps: split it into
words with one regular expression, map each word's UTF-8 bytes to printable characters, run BPE
on each word alone, then add the template's special tokens. The `tokenizers` library does all
four for every word of every document. A corpus repeats its words (35 MB of text: 8.3 million
words, 111,500 distinct), so this encoder splits with the same expression (the `regex` module,
which reads the same `\\p{L}` classes as the library's Oniguruma), asks the library's own BPE
(`Tokenizer.model.tokenize`) for each word the first time it is seen, and concatenates the
remembered ids; an ASCII-only text is split by stdlib `re` with ASCII classes (twice as fast).
The ids are the library's: the BPE is its own; the split is held to the library's on every code
point Python's Unicode tables assign (tests/unit/data/test_word_cache.py), a word with one they
do not assign sends its text to the library, and the encoder is checked against the library on a
probe text when it is made and on the first documents of every shard (data/tools/tokenize.py),
where any difference hands the whole shard to the library.

What is not of that kind gets no encoder (`word_encoder` says why) and goes through the library:
another pre-tokenizer or normalizer (sentencepiece-style BPE with byte fallback, WordPiece),
BPE dropout, truncation or padding set on the tokenizer. A text that holds an added token's
content (`<|endoftext|>`, a chat marker) is encoded whole by the library, which splits those out.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable
from typing import Any

# The `tokenizers` library's ByteLevel(use_regex=True) split: GPT-2's expression.
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CACHE_WORDS = 1 << 20  # distinct words remembered before the memory starts over (~200 MB)
PROBE = (
    "Hello world, it's 2026! Don't we'll they've I'm you'd x'LL\n\n  indented\tline\r\n"
    "numbers 1234567 3.14159 -42 0x1F; Grüße aus Jülich, ÉCOLE, naïve café, Ελληνικά, русский, "
    "中文分词没有空格。日本語のテキスト、한국어 텍스트, عربى, हिन्दी, emoji 👩‍🔬🚀 and   spaces   \n"
    "def f(x):\n    return x ** 2  # comment\n\t\ttabs\u00a0nbsp\u2028sep\u3000ideographic end  "
)


def _bytes_to_chars() -> list[str]:
    """GPT-2's byte -> printable character map (the `tokenizers` library's ByteLevel)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out, extra = [""] * 256, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


BYTE_CHARS = _bytes_to_chars()


def unassigned(word: str) -> bool:
    """Whether the word holds a code point this Python's Unicode tables (unicodedata) call
    unassigned. The split's classes (\\p{L}, \\p{N}, \\s) are read from different Unicode
    versions by the `regex` module and by the library's Oniguruma, and they differ exactly on the
    letters assigned after the older one (17,480 code points with Python 3.12's Unicode 15.0;
    tests/unit/data/test_word_cache.py holds every assigned code point to the library's split),
    so a text with such a word is left to the library."""
    return not word.isascii() and any(unicodedata.category(c) == "Cn" for c in word)


class _Unsure(Exception):
    """A word the split may not cut as the library does (unassigned)."""


def _split_pattern(pre: dict[str, Any] | None) -> str | None:
    """The one expression a byte-level pre-tokenizer splits with, or None when it is another."""
    if pre is None:
        return None
    if pre.get("type") == "ByteLevel":
        return (
            GPT2_SPLIT if pre.get("use_regex", True) and not pre.get("add_prefix_space") else None
        )
    if pre.get("type") != "Sequence" or len(pre.get("pretokenizers", [])) != 2:
        return None
    split, byte_level = pre["pretokenizers"]
    if (
        split.get("type") != "Split"
        or "Regex" not in split.get("pattern", {})
        or split.get("behavior") != "Isolated"
        or split.get("invert")
        or byte_level.get("type") != "ByteLevel"
        or byte_level.get("use_regex", True)
        or byte_level.get("add_prefix_space")
    ):
        return None
    return split["pattern"]["Regex"]


# ASCII's letters, digits and whitespace as the split's classes read them (the library's
# Oniguruma and the `regex` module agree: \\s is not \\x1c-\\x1f there, unlike stdlib `re`).
_ASCII = {"L": "A-Za-z", "N": "0-9", "s": "\\t\\n\\x0b\\x0c\\r "}


def ascii_pattern(pattern: str) -> str | None:
    """The split for ASCII-only text in stdlib `re`'s syntax (about twice the `regex` module's
    speed there): \\p{L}, \\p{N}, \\s and \\S as ASCII classes; None for what it cannot say."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            for name, key in (("\\p{L}", "L"), ("\\p{N}", "N"), ("\\s", "s")):
                if pattern.startswith(name, i):
                    out.append(_ASCII[key] if in_class else f"[{_ASCII[key]}]")
                    i += len(name)
                    break
            else:
                nxt = pattern[i + 1 : i + 2]
                if nxt == "S" and not in_class:
                    out.append(f"[^{_ASCII['s']}]")
                elif nxt in ("p", "P", "S", "X", "G") or nxt.isalpha() and nxt not in "rntfvx":
                    return None
                else:
                    out.append(pattern[i : i + 2])
                i += 2
            continue
        if ch == "[" and not in_class:
            in_class = True
        elif ch == "]" and in_class:
            in_class = False
        out.append(ch)
        i += 1
    try:
        re.compile("".join(out))
    except re.error:
        return None
    return "".join(out)


def _why_not(spec: dict[str, Any]) -> str | None:
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return f"its model is {model.get('type')}, not BPE"
    if (
        model.get("dropout")
        or model.get("continuing_subword_prefix")
        or model.get("end_of_word_suffix")
    ):
        return "its BPE uses dropout or word prefixes/suffixes"
    if model.get("byte_fallback"):
        return "its BPE falls back to bytes (a sentencepiece-style BPE)"
    if spec.get("truncation") or spec.get("padding"):
        return "truncation or padding is set on it"
    normalizer = spec.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        return f"its normalizer is {normalizer.get('type')}"
    if _split_pattern(spec.get("pre_tokenizer")) is None:
        return "its pre-tokenizer is not byte-level BPE's split"
    return None


class WordCacheEncoder:
    """texts -> id lists, the `tokenizers` library's ids for a byte-level BPE (module doc)."""

    def __init__(self, backend: Any, spec: dict[str, Any]) -> None:
        import regex  # type: ignore[import-untyped]

        self.backend = backend
        pattern = _split_pattern(spec["pre_tokenizer"])
        if pattern is None:
            raise ValueError(_why_not(spec) or "not a byte-level BPE")
        self.split = regex.compile(pattern).findall
        fast = ascii_pattern(pattern)
        self.split_ascii = re.compile(fast).findall if fast else self.split
        self.nfc = spec.get("normalizer") is not None
        added = sorted((t["content"] for t in spec.get("added_tokens", [])), key=len, reverse=True)
        self.added = re.compile("|".join(map(re.escape, added))).search if added else None
        # The template's tokens (a BOS, an EOS) around a text, as the library adds them.
        bare = backend.encode("a", add_special_tokens=False).ids
        full = backend.encode("a").ids
        at = next(i for i in range(len(full) - len(bare) + 1) if full[i : i + len(bare)] == bare)
        self.prefix, self.suffix = full[:at], full[at + len(bare) :]
        self.cache: dict[str, list[int]] = {}
        self._tokenize = backend.model.tokenize

    def _word(self, word: str) -> list[int]:
        if unassigned(word):
            raise _Unsure
        if len(self.cache) >= CACHE_WORDS:
            self.cache.clear()
        ids = [t.id for t in self._tokenize("".join(BYTE_CHARS[b] for b in word.encode()))]
        self.cache[word] = ids
        return ids

    def encode(self, text: str) -> list[int]:
        if self.nfc:
            text = unicodedata.normalize("NFC", text)
        if self.added is not None and self.added(text):
            return self.backend.encode(text).ids
        ids = list(self.prefix)
        get, word = self.cache.get, self._word
        try:
            for w in (self.split_ascii if text.isascii() else self.split)(text):
                known = get(w)
                ids += known if known is not None else word(w)
        except _Unsure:
            return self.backend.encode(text).ids
        ids += self.suffix
        return ids

    def __call__(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]


def library_encoder(backend: Any) -> Callable[[list[str]], list[list[int]]]:
    """The `tokenizers` library's own batch encoding, without offsets."""
    return lambda texts: [e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=True)]


def word_encoder(backend: Any) -> tuple[WordCacheEncoder | None, str]:
    """(the word-cache encoder, "") for a byte-level BPE that agrees with the library on PROBE;
    else (None, why not)."""
    try:
        spec = json.loads(backend.to_str())
    except Exception as err:  # noqa: BLE001 - any tokenizer the library cannot write out
        return None, f"its definition cannot be read ({err})"
    why = _why_not(spec)
    if why is not None:
        return None, why
    try:
        encoder = WordCacheEncoder(backend, spec)
    except StopIteration:
        return None, "its template does not keep a text's ids together"
    except Exception as err:  # noqa: BLE001 - e.g. an expression the regex module rejects
        return None, f"its split expression does not compile here ({err})"
    probe = [PROBE, PROBE.upper(), PROBE[::-1], "", " ", "\n\n\n"]
    if encoder(probe) != library_encoder(backend)(probe):
        return None, "its ids differ from the library's on the probe text"
    return encoder, ""
