"""training/quiet.py: the third-party notices listed as noise leave a rank's log, nothing else does,
and PYTHONWARNINGS turns the filter off. Checked against Megatron-Core's and torch's own notices,
raised by importing and calling them as a rank does, in a fresh interpreter."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.support import children

REPO = Path(__file__).resolve().parents[3]

RANK = """
import logging, sys, warnings
from training import quiet
quiet.install()
import megatron.core.optimizer  # warns at import without TE and Apex
from megatron.core.models.gpt import gpt_model
from megatron.core.utils import log_single_rank
log_single_rank(gpt_model.logger, logging.WARNING, "GPTModel IS DEPRECATED. (as in its __init__)")
warnings.warn("a warning nobody listed", UserWarning)
logging.getLogger("megatron.core.something").warning("a record nobody listed")
"""


def _rank_stderr(**env: str) -> str:
    out = children.run(
        [sys.executable, "-c", RANK],
        cwd=REPO,
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out.stderr


def test_the_filter_drops_the_noise_and_keeps_the_news() -> None:
    err = _rank_stderr()
    assert "Transformer Engine and Apex are not installed" not in err
    assert "GPTModel IS DEPRECATED" not in err
    assert "a warning nobody listed" in err and "a record nobody listed" in err


def test_pythonwarnings_turns_the_filter_off() -> None:
    """The user's choice wins; and the notices are really there without the filter (one that
    Megatron-Core no longer prints would fail here: its line in NOISE is then dead)."""
    err = _rank_stderr(PYTHONWARNINGS="default")
    assert "Transformer Engine and Apex are not installed" in err
    assert "GPTModel IS DEPRECATED" in err


# --- the test suite's own filters (pyproject.toml, and NOISE through tests/conftest.py) -----------

NOTICES = [  # (message, category, module that issues it, hidden from the warnings summary)
    ("Warning: tp_group is None, using default tp group.", DeprecationWarning,
     "megatron.core.tensor_parallel.layers", True),
    ("Warning: tp_group is None, using default tp group.", DeprecationWarning,
     "megatron.core.tensor_parallel.mappings", False),
    ("MLP requires ffn_hidden_size, but it was not provided.", DeprecationWarning,
     "megatron.core.transformer.mlp", True),
    ("MLP requires ffn_hidden_size, but it was not provided.", DeprecationWarning,
     "models.gpt", False),
    ("Apex is not installed. Falling back to Torch Norm", UserWarning,
     "megatron.core.models.backends", True),
    ("torch.distributed is disabled, unavailable or uninitialized, assuming ...", UserWarning,
     "torch.distributed.checkpoint.utils", True),
    ("This module is deprecated and will be removed.", DeprecationWarning,
     "leptonai.api.v0", True),
    ("a notice nobody listed", UserWarning, "megatron.core.optimizer.optimizer", False),
]  # fmt: skip


def test_the_suites_filters_hide_listed_third_party_notices_only(
    pytestconfig: pytest.Config,
) -> None:
    """A notice of Megatron-Core's is hidden only where Megatron-Core issues it: the same one
    from another of its modules, or from ours, still reaches the warnings summary."""
    import builtins
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for line in pytestconfig.getini("filterwarnings"):
            action, message, category, module = (line.split(":") + ["", ""])[:4]
            warnings.filterwarnings(
                action, message, getattr(builtins, category or "Warning"), module
            )
        for n, (message, category, module, _) in enumerate(NOTICES):
            warnings.warn_explicit(message, category, f"{module}.py", n, module=module)
    shown = {w.lineno for w in seen}
    assert shown == {n for n, (*_, hidden) in enumerate(NOTICES) if not hidden}
