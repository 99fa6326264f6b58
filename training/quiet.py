"""Third-party notices that say nothing about the run, kept out of every rank's log.

A two-rank CPU demo printed 52 such lines out of 124: each rank repeats, at import, that Transformer
Engine and Apex are missing (the engine picks Torch's optimizer and norms itself when they are), that `GPTModel` is deprecated, that torch's collectives were renamed... A user reading
the log for what went wrong should see our lines and the warnings that are news. `install()` drops
exactly the notices listed in `NOISE`, each with why it is harmless here; anything else, a new
warning of the same libraries included, still prints.

The user's own choice wins: with PYTHONWARNINGS set (`PYTHONWARNINGS=default recipes run ...`)
nothing is filtered, warnings or log records.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Notice:
    pattern: str  # a regular expression matched at the start of the message
    why: str  # why it is harmless in a run of ours
    warning: type[Warning] | None = None  # a `warnings` category; None: a log record


NOISE = (
    Notice(
        r"Transformer Engine and Apex are not installed",
        "without TE the engine uses Torch's optimizer and the local or SDPA layer spec on purpose",
        UserWarning,
    ),
    Notice(
        r"Apex is not installed", "Torch's norms are the fallback the engine expects", UserWarning
    ),
    Notice(
        r"full scope is deprecated",
        "Megatron-Core's own default for CUDA graphs, which we do not capture",
        UserWarning,
    ),
    Notice(r"MimoModelConfig is experimental", "imported by Megatron-Core, not used", UserWarning),
    Notice(
        r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
        "called inside Megatron-Core; the renamed functions do the same",
        FutureWarning,
    ),
    Notice(r"GPTModel IS DEPRECATED", "GPTModel is Megatron-Core's supported dense/MoE model"),
    Notice(r"Implicit initialization of Rerun State Machine", "its default, disabled, is ours"),
    Notice(r"RerunStateMachine initialized in mode RerunMode\.DISABLED", "as above"),
    Notice(
        r"Unable to save MockGPTDataset indexes",
        "mock data is generated again on every start; there is nothing to cache",
    ),
    Notice(
        r"MCore's async save is deprecated",
        "the NVRx strategy it points to needs nvidia-resiliency-ext, an optional extra",
    ),
    Notice(
        r"No CUDA runtime is found",
        "printed by torch's extension loader on every CPU rank; the CPU mode needs no CUDA",
    ),
)
_LOG_NOISE = re.compile("|".join(f"(?:{n.pattern})" for n in NOISE if n.warning is None))


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _LOG_NOISE.match(record.getMessage())


def install(environ: Mapping[str, str] = os.environ) -> bool:
    """Filter the notices of `NOISE` in this process; False (nothing changed) when the user set
    PYTHONWARNINGS. Call it before Megatron-Core is imported: most warn at import."""
    if environ.get("PYTHONWARNINGS"):
        return False
    for notice in NOISE:
        if notice.warning is not None:
            warnings.filterwarnings("ignore", message=notice.pattern, category=notice.warning)
    # Megatron-Core logs through module loggers that reach the root logger's handlers, or
    # logging's last-resort handler when there are none; torch's extension loader has a handler
    # of its own. A filter on each handler sees every record, whatever logger it came from.
    drop = _DropNoise()
    for handler in [*logging.getLogger().handlers, logging.lastResort]:
        if handler is not None:
            handler.addFilter(drop)
    logging.getLogger("torch.utils.cpp_extension").addFilter(drop)
    return True
