"""A full disk, simulated in-process: the errors the writers raise when the disk fills up."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any

# Python's OSError, and the RuntimeError torch's zip writer (torch.save) raises for the short write
# it then makes.
FULL_DISK: dict[str, Callable[[], BaseException]] = {
    "oserror": lambda: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
    "torch": lambda: RuntimeError(
        "[enforce fail at inline_container.cc:671] . unexpected pos 704 vs 598"
    ),
}


def fills_up(real: Any, after: int, error: str) -> Any:
    """`real`, which raises the full-disk `error` on its call number `after` + 1 and later."""
    calls = [0]

    def call(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] > after:
            raise FULL_DISK[error]()
        return real(*args, **kwargs)

    return call
