"""The valid values of the config's fields (config/schema.py): `within` gives a number its range,
`one_of` gives a string the registry its values live in, and the upper bounds far above any
published model. `config.tree` refuses other values at override time, the checker
(config/rules/choices.py, config/rules/ranges.py) those a recipe set in Python. Like the schema,
this module does not use `from __future__ import annotations` (NeMo-Run's parser reads real
types)."""

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


def one_of(choices: Callable[[], Iterable[str]]) -> dict[str, Any]:
    """Field metadata for a string whose valid values live in a registry (data kinds, model
    architectures, precision presets): checked like a Literal, but the registry can grow."""
    return {"one_of": choices}


@dataclass(frozen=True, slots=True)
class Range:
    """The valid values of a number: finite, from `low` to `high`; an open end is itself refused."""

    low: float
    high: float = math.inf  # inf: any finite number from `low` up
    low_open: bool = False
    high_open: bool = False
    note: str = ""  # what an edge value means, e.g. "0 turns clipping off"

    def __str__(self) -> str:
        if self.high == math.inf:
            return f"{'>' if self.low_open else '>='} {_number(self.low)}"
        left = "(" if self.low_open else "["
        right = ")" if self.high_open else "]"
        return f"in {left}{_number(self.low)}, {_number(self.high)}{right}"

    def refuses(self, value: Any, integer: bool) -> str | None:
        """Why `value` is not a valid number of this range (an integer one if `integer`), or None."""
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        ok = is_number and (isinstance(value, int) or (not integer and math.isfinite(value)))
        if ok:
            above = self.low < value if self.low_open else self.low <= value
            below = value < self.high if self.high_open else value <= self.high
            if above and below:
                return None
        what = "an integer" if integer else "a finite number"
        note = f" ({self.note})" if self.note else ""
        # Python refuses to print an int of over 4,300 digits; its size is what matters here.
        huge = isinstance(value, int) and value.bit_length() > 128
        got = f"a {value.bit_length()}-bit integer" if huge else repr(value)
        return f"must be {what} {self}{note}, got {got}"


def _number(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def within(
    low: float,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
    note: str = "",
) -> dict[str, Any]:
    """Field metadata for a number: finite and within [low, high] (an open end excludes itself)."""
    return {"range": Range(low, high, low_open, high_open, note)}


# Upper bounds far above any published model, so that a slip (an extra zero or three) is refused on
# the login node, before it asks a GPU for exabytes, and no list or loop of the checker over layers,
# stages or divisors can grow without bound.
MAX_LAYERS = 10_000  # DeepNet trained 1,000 layers; Llama 3.1 405B has 126
MAX_WIDTH = 2**20  # hidden, FFN, latent and head sizes (Llama 3.1 405B: hidden 16,384, FFN 53,248)
MAX_HEADS = 2**16  # attention heads, query groups, experts (DeepSeek-V3: 128 heads, 256 experts)
MAX_SEQ = 2**24  # 16.8M tokens; the longest published context windows hold 10M
MAX_VOCAB = 2**24  # 16.8M; the largest published vocabularies hold ~262k tokens
MAX_GPUS = 2**20  # ranks along one parallel dimension, and in a whole job (config/rules/cluster.py)
MAX_STEPS = 10**9  # steps, intervals and counts of them; published runs take at most millions
MAX_SAMPLES = 2**24  # sequences in a global batch or a microbatch
MAX_IMAGE = 2**16  # pixels along an image side, and a patch side

LAYERS = within(1, MAX_LAYERS)
WIDTH = within(1, MAX_WIDTH)
HEADS = within(1, MAX_HEADS)
RANKS = within(1, MAX_GPUS)
STEPS = within(1, MAX_STEPS)
# NumPy takes seeds below 2**32; Megatron adds to ours (100 x PP rank, 2718 + TP rank, 1024 + 100
# x EP rank), so half of that range keeps every derived seed valid.
SEED = within(0, 2**31 - 1)
DROPOUT = within(0, 1, high_open=True, note="1 would drop every activation")
# Adam's moment decay rates: at 1, its bias correction (1 - beta**step) divides by 0.
BETA = within(0, 1, high_open=True)
# Far enough from 0 that FP32 holds it: 0 would divide 0 by 0 where a gradient or input is 0.
EPSILON = within(1e-30, 1)
NON_NEGATIVE = within(0)
POSITIVE = within(0, low_open=True)
INTERVAL = within(0, MAX_STEPS, note="0 means never")  # steps between events
