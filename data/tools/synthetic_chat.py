"""A small generated chat set for tests and the CPU demo: multi-turn arithmetic with a system message.

    recipes data make-synthetic-chat [OUT.jsonl] [--samples N] [--seed K] [--tokenizer DIR]

writes OUT.jsonl, one conversation a line (data.kind=chat): a system message, a question, and one
or two follow-ups that build on the previous answer ("and that plus 3 ?"), each answered. With
`--tokenizer DIR` it also writes DIR, a Hugging Face tokenizer folder (a byte-level BPE trained on
the conversations, below tiny_gpt's 512 ids) whose tokenizer_config.json carries a ChatML chat
template, so the set trains without a downloaded model.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

from data.tools.synthetic_sft import OPS

SYSTEMS = (
    "you are a careful calculator .",
    "you answer arithmetic questions briefly .",
    "you are a helpful assistant . keep answers short .",
)
# ChatML without {% generation %} markers: data/chat.py finds the assistant turns by rendering.
CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CHATML_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def conversation(rng: random.Random) -> dict:
    """One conversation: a system message and one to three exchanges on a running value."""
    a, b, op = rng.randint(0, 20), rng.randint(0, 20), rng.choice(list(OPS))
    value = OPS[op](a, b)
    messages = [
        {"role": "system", "content": rng.choice(SYSTEMS)},
        {"role": "user", "content": f"what is {a} {op} {b} ?"},
        {"role": "assistant", "content": f"{a} {op} {b} is {value} ."},
    ]
    for _ in range(rng.randint(0, 2)):
        c, op = rng.randint(1, 9), rng.choice(list(OPS))
        new = OPS[op](value, c)
        messages.append({"role": "user", "content": f"and that {op} {c} ?"})
        messages.append({"role": "assistant", "content": f"{value} {op} {c} is {new} ."})
        value = new
    return {"messages": messages}


def write_chat_tokenizer(
    folder: str | Path,
    texts: Iterable[str],
    *,
    template: str = CHATML,
    special_tokens: Sequence[str] = CHATML_TOKENS,
    eos_token: str = "<|im_end|>",
    bos_token: str | None = None,
    vocab_size: int = 384,
) -> Path:
    """A Hugging Face tokenizer folder: a byte-level BPE trained on `texts` with
    `special_tokens` (ids 0..), and tokenizer_config.json carrying the chat `template`."""
    from data.tools.make_tokenizer import train_bpe_tokenizer

    folder = Path(folder)
    train_bpe_tokenizer(
        texts=texts,
        vocab_size=vocab_size,
        out=folder / "tokenizer.json",
        special_tokens=special_tokens,
    )
    settings = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": eos_token,
        "bos_token": bos_token,
        "chat_template": template,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    return folder


def make_synthetic_chat(
    out: str | Path, *, samples: int = 2000, seed: int = 0, tokenizer: str | Path | None = None
) -> Path:
    """Write the conversations to `out` (data.path), and a tokenizer folder if asked."""
    if samples < 1:
        raise ValueError(f"--samples must be at least 1, got {samples}")
    rng = random.Random(seed)
    rows = [conversation(rng) for _ in range(samples)]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    if tokenizer is not None:
        texts = [" ".join(m["content"] for m in r["messages"]) for r in rows]
        write_chat_tokenizer(tokenizer, texts)
    return out
