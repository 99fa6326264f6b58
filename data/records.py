"""The JSONL records of data.kind sft and chat, read and checked line by line, without torch.

The datasets (data/sft.py, data/chat.py) read their files through these functions on the ranks;
`recipes run` reads the same file through them before anything is launched or queued
(launchers/inputs.py), so a bad line is reported once, naming the file and the line, instead of as
a traceback per rank after the queue.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

PROMPT_KEYS = ("prompt", "input")
RESPONSE_KEYS = ("response", "output")
ROLES = ("system", "user", "assistant")


class SFTDataError(ValueError):
    """A line of data.path that is not a prompt/response pair."""


class ChatDataError(SFTDataError):
    """A line of data.path that is not a conversation, or one the chat template cannot mask."""


def numbered_lines(path: Path, error: type[ValueError] = SFTDataError) -> Iterator[tuple[int, str]]:
    """(number, text) of every line; one that is not UTF-8, or a .gz that is cut short or
    corrupt, is an `error` naming the file and the line."""
    opener = gzip.open if path.suffix == ".gz" else open
    number = 0
    with opener(path, "rb") as f:
        lines = iter(f)
        while True:
            try:
                raw = next(lines)
            except StopIteration:
                return
            except (EOFError, OSError, zlib.error) as err:  # gzip: truncated, or not gzip at all
                raise error(
                    f"{path}:{number + 1}: cannot read past line {number} ({err}); the file is "
                    "truncated or corrupt: write (or compress) it again"
                ) from None
            number += 1
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise error(
                    f"{path}:{number}: not UTF-8 (byte {raw[err.start]:#04x} at byte "
                    f"{err.start + 1} of the line); convert the file, e.g. iconv -f latin1 -t utf-8"
                ) from None
            yield number, text


def _pick(obj: dict, keys: Sequence[str], path: Path, line: int) -> str:
    for key in keys:
        if key in obj:
            value = obj[key]
            if not isinstance(value, str):
                raise SFTDataError(
                    f"{path}:{line}: {key!r} must be a string, not {type(value).__name__}"
                )
            return value
    raise SFTDataError(
        f"{path}:{line}: no {' or '.join(map(repr, keys))} key; each line of data.path must be "
        '{"prompt": "...", "response": "..."} (or "input"/"output")'
    )


def read_pairs(path: str | Path) -> Iterator[tuple[int, str, str]]:
    """(line, prompt, response) of every non-blank line; a bad line is an SFTDataError naming
    the file and the line."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(
            f"data.path={str(path)!r} is not a file; data.kind=sft reads a JSONL file of "
            '{"prompt": ..., "response": ...} lines'
        )
    for number, line in numbered_lines(p):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise SFTDataError(f"{p}:{number}: not JSON ({err.msg})") from None
        if not isinstance(obj, dict):
            raise SFTDataError(f"{p}:{number}: a line must be a JSON object")
        prompt, response = _pick(obj, PROMPT_KEYS, p, number), _pick(obj, RESPONSE_KEYS, p, number)
        if not response.strip():
            raise SFTDataError(
                f"{p}:{number}: the response is empty, so the pair teaches nothing but to stop; "
                "fill it in or drop the line"
            )
        yield number, prompt, response


def _message(obj: Any, path: Path, line: int, k: int) -> dict[str, str]:
    where = f"{path}:{line}: message {k}"
    if not isinstance(obj, dict):
        raise ChatDataError(f"{where} must be an object with role and content")
    role, content = obj.get("role"), obj.get("content")
    if not isinstance(role, str) or not isinstance(content, str):
        raise ChatDataError(
            f"{where}: role and content must be strings, got role={role!r}, content of type "
            f"{type(content).__name__}"
        )
    if role not in ROLES:
        raise ChatDataError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
    if role == "system" and k != 0:
        raise ChatDataError(f"{where}: a system message may only come first")
    if role == "assistant" and not content.strip():
        raise ChatDataError(f"{where}: the assistant's content is empty; fill it in or drop it")
    return {"role": role, "content": content}


def read_conversations(path: str | Path) -> Iterator[tuple[int, list[dict[str, str]]]]:
    """(line, messages) of every non-blank line, cut after its last assistant message; a line that
    is not a conversation with an answer is a ChatDataError naming the file and the line."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(
            f"data.path={str(path)!r} is not a file; data.kind=chat reads a JSONL file of "
            '{"messages": [{"role": ..., "content": ...}, ...]} lines'
        )
    for number, line in numbered_lines(p, ChatDataError):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise ChatDataError(f"{p}:{number}: not JSON ({err.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list):
            raise ChatDataError(
                f"{p}:{number}: no messages list; each line of data.path must be "
                '{"messages": [{"role": "user", "content": "..."}, {"role": "assistant", ...}]}'
            )
        messages = [_message(m, p, number, k) for k, m in enumerate(obj["messages"])]
        answers = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
        if not answers:
            raise ChatDataError(
                f"{p}:{number}: no assistant message, so the conversation teaches nothing; "
                "add the answer or drop the line"
            )
        first = 1 if messages[0]["role"] == "system" else 0
        if messages[first]["role"] != "user":
            raise ChatDataError(
                f"{p}:{number}: message {first} must be the user's: the first assistant turn "
                "answers something"
            )
        yield number, messages[: answers[-1] + 1]
