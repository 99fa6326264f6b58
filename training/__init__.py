"""The training engine: `training.pretrain(config)` runs on every rank (see training/entry.py).

The config schema it trains from lives one floor down, in `config/` (torch-free). Importing this
package stays free of torch and Megatron-Core, so `pretrain` is resolved on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["pretrain"]


def __getattr__(name: str) -> Any:
    if name == "pretrain":
        from training.entry import pretrain

        return pretrain
    raise AttributeError(f"module 'training' has no attribute {name!r}")
