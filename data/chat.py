"""Chat fine-tuning (data.kind=chat): JSONL conversations in the model's chat template, loss on the
assistant's turns.

Input: `data.path`, a JSONL file (or `.jsonl.gz`) with one conversation a line:
`{"messages": [{"role": "system", "content": "..."}, {"role": "user", ...}, {"role": "assistant",
...}, ...]}`. Roles are system (first only, optional), user and assistant; the first message after
the system one is the user's, and turns may go on for any number of exchanges. Messages after the
last assistant one teach nothing and are left out.

Rendering: `data.tokenizer` is a Hugging Face tokenizer folder whose chat template (`chat_template`
in tokenizer_config.json, or chat_template.jinja) renders each conversation exactly as the model
will see it when it is served, and the fast tokenizer encodes that text. Loss falls on the
assistant's content and the end-of-turn token that closes it (`<|eot_id|>`, `<|im_end|>`), never on
the system or user turns nor on the assistant header that the server writes itself
(`<|start_header_id|>assistant<|end_header_id|>\\n\\n`, `<|im_start|>assistant\\n`). Which characters
those are:
- a template with `{% generation %}` markers says so itself (transformers'
  `return_assistant_tokens_mask`);
- any other (Llama 3's and Qwen3's have none): turn i's text is what rendering messages[:i + 1]
  adds to rendering messages[:i] with the generation prompt, less the whitespace after its
  end-of-turn token, provided each such rendering is a prefix of the whole conversation's;
- a template that rewrites earlier turns once later ones come (Qwen3's drops the <think> block of
  every assistant turn before the last user message, and writes an empty one into the last turn)
  breaks that prefix property. Then each turn is found in the whole rendering by its boundaries:
  the generation prompt that opens it and the end-of-turn text that closes it, both learnt by
  rendering the template, and the span must hold the message's answer. What cannot be found so is a
  ChatDataError naming data.tokenizer; give such a template `{% generation %}` markers.
Characters become tokens by the fast tokenizer's offsets: a token carries loss when it overlaps an
assistant span.

Length: a conversation longer than model.seq_length + 1 tokens loses its oldest exchanges (a user
message and the answers that follow it), whole, keeping the system message, until it fits; one
whose last exchange alone does not fit is skipped. Both counts are printed on the first rank.

Errors: every line is read and rendered when the dataset is built, before the first step; a line
that is not a conversation is a ChatDataError naming the file and the line, and so is a rendering
that the template's loops drag past data/template_limit.py's bound.

Rows, order, split, packing and epochs are data.kind=sft's (data/sft.py `TokenRows`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from config.finalize import Derived
from config.schema import TrainingConfig
from data.batches import SampledBatches
from data.records import ChatDataError, read_conversations
from data.sft import TokenRows, build_rows, on_first_rank, rows_batches
from data.template_limit import TemplateTooLong

GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
# Stands in for an assistant message to learn what the template writes after one: no whitespace
# (templates trim), no '<think>' (Qwen3 splits on it).
PROBE = "PROBE_d41d8cd98f00b204"


@dataclass(frozen=True, slots=True)
class Conversation:
    """One rendered and tokenized conversation, and which of its tokens are the assistant's."""

    ids: np.ndarray  # int32
    assistant: np.ndarray  # bool, one per id: the token is the assistant's (content, end of turn)

    def loss_mask(self) -> list[float]:
        """Per (input, label) position: 1 where the label, token j + 1, is the assistant's."""
        return self.assistant[1:].astype(np.float32).tolist()


def exchanges(messages: list[dict[str, str]]) -> list[list[dict[str, str]]]:
    """The conversation after its system message, cut before every user message that follows an
    assistant one: each piece is one exchange (the user's messages and the answers)."""
    out: list[list[dict[str, str]]] = []
    for k, m in enumerate(messages):
        if m["role"] == "system":
            continue
        if not out or (m["role"] == "user" and messages[k - 1]["role"] == "assistant"):
            out.append([])
        out[-1].append(m)
    return out


class ChatTemplate:
    """Renders conversations with a tokenizer folder's chat template and marks the assistant's
    tokens (see the module docstring for how)."""

    def __init__(self, tokenizer: Any) -> None:
        backend = tokenizer.transformers_tokenizer  # data/tokenizer.py LocalTokenizer
        self.name = tokenizer.path
        if backend is None or not backend.is_fast:
            raise ValueError(
                f"data.tokenizer={self.name!r}: data.kind=chat needs a Hugging Face tokenizer "
                "folder with a fast tokenizer (tokenizer.json) and its chat template"
            )
        try:
            self.template = backend.get_chat_template()
        except ValueError:
            raise ValueError(
                f"data.tokenizer={self.name!r} has no chat template (no chat_template in its "
                "tokenizer_config.json, no chat_template.jinja); point data.tokenizer at the "
                "instruct model's tokenizer folder, or use data.kind=sft for prompt/response pairs"
            ) from None
        self.tokenizer, self.backend = tokenizer, backend
        self.marked = bool(GENERATION.search(self.template))

    def render(self, messages: list[dict[str, str]], prompt: bool = False) -> str:
        # The tokenizer's rendering is bounded (data/template_limit.py): a template is foreign code.
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=prompt
        )

    def encode(self, messages: list[dict[str, str]], where: str) -> Conversation:
        """Token ids of the conversation and which are the assistant's; `where` (file:line)
        names it in errors."""
        try:
            return self._encode(messages, where)
        except TemplateTooLong as err:
            raise TemplateTooLong(f"{where}: {err}") from None

    def _encode(self, messages: list[dict[str, str]], where: str) -> Conversation:
        mask: list[int] | np.ndarray
        if self.marked:
            out = self.tokenizer.apply_chat_template(
                messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
            ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
        else:
            text = self.render(messages)
            spans = self._spans_by_prefix(messages, text)
            if spans is None:
                spans = self._spans_by_boundaries(messages, text, where)
            encoded = self.backend(text, add_special_tokens=False, return_offsets_mapping=True)
            ids = list(encoded["input_ids"])
            mask = _overlapping(np.asarray(encoded["offset_mapping"]).reshape(-1, 2), spans)
        return Conversation(np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=bool))

    def _spans_by_prefix(
        self, messages: list[dict[str, str]], text: str
    ) -> list[tuple[int, int]] | None:
        """[start, end) of each assistant turn in `text`, or None when the template does not
        render conversations by appending (a rendering of a prefix is not a prefix of `text`)."""
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before, upto = self.render(messages[:i], prompt=True), self.render(messages[: i + 1])
            if not (upto.startswith(before) and text.startswith(upto)):
                return None
            spans.append((len(before), len(upto.rstrip())))
        return spans

    def _spans_by_boundaries(
        self, messages: list[dict[str, str]], text: str, where: str
    ) -> list[tuple[int, int]]:
        """[start, end) of each assistant turn in `text`, between the generation prompt that
        opens it and the end-of-turn text that closes it."""
        spans, cursor = [], 0
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            bare, prompted = self.render(messages[:i]), self.render(messages[:i], prompt=True)
            probe = self.render([*messages[:i], {"role": "assistant", "content": PROBE}])
            opener = prompted[len(bare) :] if prompted.startswith(bare) else ""
            closer = probe[probe.find(PROBE) + len(PROBE) :].rstrip() if PROBE in probe else ""
            start = text.find(opener, cursor) if opener and closer else -1
            end = text.find(closer, start + len(opener)) if start >= 0 else -1
            answer = m["content"].split("</think>")[-1].strip()
            if end < 0 or answer not in text[start + len(opener) : end]:
                raise ChatDataError(
                    f"{where}: data.tokenizer={self.name!r}: its chat template renders earlier "
                    "turns differently once later messages follow, and assistant message "
                    f"{i} cannot be found between the template's generation prompt "
                    f"({opener!r}) and end of turn ({closer!r}). Give the template "
                    "{% generation %} markers around the assistant's content and end of turn"
                )
            spans.append((start + len(opener), end + len(closer)))
            cursor = end + len(closer)
        return spans


def _overlapping(offsets: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """Per token of character range offsets[j], whether it overlaps one of the spans."""
    starts, ends = offsets[:, 0], np.maximum(offsets[:, 1], offsets[:, 0] + 1)
    mask = np.zeros(len(offsets), dtype=bool)
    for a, b in spans:
        mask |= (starts < b) & (ends > a)
    return mask


def tokenize_conversations(
    conversations: Iterator[tuple[int, list[dict[str, str]]]],
    template: ChatTemplate,
    max_tokens: int,
    path: str,
) -> tuple[list[Conversation], int, int]:
    """Every conversation tokenized within `max_tokens`; also how many lost their oldest
    exchanges to fit, and how many were skipped because even their last exchange does not."""
    out: list[Conversation] = []
    truncated = skipped = 0
    for line, messages in conversations:
        system = messages[:1] if messages[0]["role"] == "system" else []
        turns = exchanges(messages)
        where = f"{path}:{line}"
        for first in range(len(turns)):
            sample = template.encode(system + [m for t in turns[first:] for m in t], where)
            if len(sample.ids) <= max_tokens:
                break
        else:
            skipped += 1
            continue
        if not sample.assistant.any():
            raise ChatDataError(
                f"{where}: data.tokenizer={template.name!r}: the chat template's rendering "
                "leaves no assistant token to learn from"
            )
        truncated += first > 0
        out.append(sample)
    return out, truncated, skipped


class ChatDataset(TokenRows):
    """The conversations of data.path as rows (data/sft.py TokenRows)."""

    error = ChatDataError
    noun = "conversations"

    def __init__(
        self,
        path: str,
        tokenizer: Any,
        *,
        seq_length: int,
        num_samples: int,
        packing: bool,
        seed: int,
        split: str = "1,0,0",
        part: str = "train",
    ) -> None:
        template = ChatTemplate(tokenizer)
        # A sample of n ids gives n - 1 (input, label) positions; a row holds seq_length of them.
        conversations, self.truncated, self.skipped = tokenize_conversations(
            read_conversations(path), template, seq_length + 1, str(Path(path).expanduser())
        )
        if not conversations and not self.skipped:
            raise ChatDataError(f"data.path={path!r} holds no conversation: it is empty")
        if not conversations:
            raise ChatDataError(
                f"data.path={path!r} holds no conversation whose last exchange fits in "
                f"model.seq_length={seq_length} ({self.skipped} skipped); raise "
                "model.seq_length or shorten the conversations"
            )
        super().__init__(
            conversations,
            path=path,
            seq_length=seq_length,
            num_samples=num_samples,
            packing=packing,
            seed=seed,
            split=split,
            part=part,
            pad=tokenizer.eod,
        )


def build_chat_dataset(
    cfg: Any, tokenizer: Any, num_samples: int, part: str = "train"
) -> ChatDataset:
    """data.kind=chat for a run: every rank reads and renders data.path the same way, and takes
    the `part` of the shuffled conversations that data.split gives it."""
    dataset = build_rows(ChatDataset, cfg, tokenizer, num_samples, part)
    if part == "train" and (dataset.truncated or dataset.skipped):
        on_first_rank(
            f"chat data: {dataset.truncated} conversations lost their oldest exchanges and "
            f"{dataset.skipped} were skipped (their last exchange alone is longer than "
            f"model.seq_length={cfg.model.seq_length})"
        )
    return dataset


def batches(
    cfg: TrainingConfig, derived: Derived, dp_rank: int, device: str, part: str = "train"
) -> SampledBatches:
    """The batch source of data.kind=chat (config/registry.py): this rank's share of the `part`
    ("train" or "valid") rows, enough for every step (or evaluation) of the run."""
    return rows_batches(build_chat_dataset, cfg, derived, dp_rank, device, part)
