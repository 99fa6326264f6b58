"""Shared test setup: no test writes to the user's home or reaches a hub; GPU tests skip without one."""

from __future__ import annotations

import os
import tempfile

import pytest

# Before any test imports NeMo-Run, matplotlib or HF code: their caches go to a throwaway folder,
# and nothing may try a hub download.
_HOME = tempfile.mkdtemp(prefix="recipes-tests-")
for _var in ("NEMORUN_HOME", "HF_HOME", "MPLCONFIGDIR"):
    os.environ[_var] = os.path.join(_HOME, _var.lower())
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")


def pytest_configure(config: pytest.Config) -> None:
    """The notices a run keeps out of its ranks' logs (training/quiet.py NOISE) are kept out of
    the warnings summary too, so that what is left there is news (pyproject.toml: the others)."""
    from training.quiet import NOISE

    for notice in NOISE:
        if notice.warning is not None:
            line = f"ignore:{notice.pattern}:{notice.warning.__name__}"
            config.addinivalue_line("filterwarnings", line)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marker: gpu)")
    for item in gpu_items:
        item.add_marker(skip)
