"""training/quiet.py: the third-party notices listed as noise leave a rank's log, nothing else does,
and PYTHONWARNINGS turns the filter off. Checked against Megatron-Core's and torch's own notices,
raised by importing and calling them as a rank does, in a fresh interpreter."""

from __future__ import annotations

import os
import sys
from pathlib import Path

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
