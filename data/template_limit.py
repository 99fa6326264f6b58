"""A bound on the work of rendering one chat template: a template comes with a tokenizer folder,
from whoever made it, and jinja's sandbox stops it from reaching Python but not from looping.

Two loops nested over `range(100000)` render for minutes. Rendering inside `bounded(name)` counts
the steps of the template's own compiled code, each loop iteration (a backward jump) and each call
of one of its functions (macros, blocks), and raises `TemplateTooLong` past `TEMPLATE_STEPS`: a
count, so where it stops does not depend on the machine's speed. The count comes from
`sys.monitoring` (Python 3.12): the first call of any function is seen once, and all but the
template's code (jinja compiles it under the file name "<template>") are switched off for good at
that moment, so the rest of the program runs at full speed; the template's code reports its loop
iterations only. Real templates take a few steps per message (Qwen3's about 3).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from types import CodeType
from typing import Any

from data.records import ChatDataError

# Steps one rendering may take: room for conversations of some hundred thousand messages.
TEMPLATE_STEPS = 1_000_000
TEMPLATE_FILE = "<template>"  # the file name jinja compiles a template from a string under
# sys.monitoring's tool ids 0-5: 0, 1, 2 and 5 are the debugger's, coverage's, the profiler's and
# the optimizer's by convention; the first free of these is taken once, for the process.
_TOOL_IDS = (4, 3)


class TemplateTooLong(ChatDataError):
    """A chat template that rendering stopped after TEMPLATE_STEPS steps."""


class _Budget(threading.local):
    """The rendering under way in this thread: the template's name and the steps left."""

    name: str | None = None
    left = 0


_budget = _Budget()
_tool: list[int | None] = []  # [the tool id] once claimed ([None]: none was free)


def _step() -> None:
    name = _budget.name
    if name is None:  # template code run outside `bounded`
        return
    _budget.left -= 1
    if _budget.left < 0:
        _budget.name = None  # once: the error unwinds through more template code
        raise TemplateTooLong(
            f"data.tokenizer={name!r}: its chat template took more than {TEMPLATE_STEPS:,} loop "
            "steps rendering one conversation (loops nested without end?) and was stopped; fix "
            "the template (chat_template in tokenizer_config.json, or chat_template.jinja)"
        )


def _started(code: CodeType, offset: int) -> Any:
    events = sys.monitoring.events
    if code.co_filename != TEMPLATE_FILE:
        return sys.monitoring.DISABLE  # this function is never reported again
    tool = _tool[0]
    if tool is not None:
        sys.monitoring.set_local_events(tool, code, events.JUMP)
    _step()
    return None


def _jumped(code: CodeType, offset: int, destination: int) -> None:
    _step()


def _claim() -> int | None:
    if not _tool:
        events = sys.monitoring.events
        for tool in _TOOL_IDS:
            try:
                sys.monitoring.use_tool_id(tool, "chat template bound")
            except ValueError:  # taken
                continue
            sys.monitoring.register_callback(tool, events.PY_START, _started)
            sys.monitoring.register_callback(tool, events.JUMP, _jumped)
            _tool.append(tool)
            break
        else:
            _tool.append(None)
    return _tool[0]


@contextlib.contextmanager
def bounded(name: str) -> Iterator[None]:
    """Render inside this: TemplateTooLong, naming `name` (data.tokenizer), past TEMPLATE_STEPS.
    Where every tool id is taken by other monitors, rendering goes unbounded."""
    tool = _claim()
    if tool is None:
        yield
        return
    _budget.name, _budget.left = name, TEMPLATE_STEPS
    sys.monitoring.set_events(tool, sys.monitoring.events.PY_START)
    try:
        yield
    finally:
        sys.monitoring.set_events(tool, 0)
        _budget.name = None
