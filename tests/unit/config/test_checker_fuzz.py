"""The checker never crashes, overflows or runs away, and what it accepts starts.

- Every number of the schema (found from the dataclasses, not listed by hand), given an extreme
  value (0, negatives, nan, inf, integers up to 2**70, 5e-324) by an override or set in Python,
  gets one of `recipes check`'s exit codes within hypothesis's deadline: 0 (valid, fits), 2
  (invalid) or 3 (valid, does not fit). Never an exception.
- `model.num_layers=2147483648`, which once took a login node's 16 GiB for ten minutes, exits 2 at
  once in a fresh process.
- A seeded sample of plausible values that `check` accepts on the CPU starts the engine and trains
  a step with a finite loss, in this process on one gloo rank (tests/unit/training/test_engine.py's fixtures).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import random
import sys
import types
import typing
from datetime import timedelta
from pathlib import Path
from typing import Any, Union

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from config.bounds import Range
from config.schema import TrainingConfig
from config.tree import ConfigError, apply_overrides, field_types, get_path, out_of_range
from launchers.jobsize import JobSize, job_cluster
from recipes.advice.check import EXIT_INVALID, EXIT_NO_FIT, EXIT_OK, check
from recipes.cli import main
from recipes.registry import resolve
from tests.support import children
from tests.unit.training.test_engine import ONE_CPU, losses, one_rank, tiny  # noqa: F401 (one_rank: a fixture)

EXIT_CODES = {EXIT_OK, EXIT_INVALID, EXIT_NO_FIT}  # recipes/advice/check.py, the CLI contract
REPO = Path(__file__).resolve().parents[3]


@dataclasses.dataclass(frozen=True)
class Number:
    path: str  # dotted, e.g. model.num_layers
    section: type  # the dataclass that holds it
    name: str
    integer: bool

    def node(self, cfg: TrainingConfig) -> Any:
        """The section of `cfg` that holds this number."""
        return get_path(cfg, self.path.rpartition(".")[0])

    @property
    def range(self) -> Range | None:
        field = next(f for f in dataclasses.fields(self.section) if f.name == self.name)
        return field.metadata.get("range")


def _bare(tp: Any) -> Any:
    """X for Optional[X], else tp."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    optional = typing.get_origin(tp) in (Union, types.UnionType) and len(args) == 1
    return args[0] if optional else tp


def numbers(cls: type = TrainingConfig, prefix: str = "") -> list[Number]:
    """Every int and float field of the schema, sections (model.vision too) walked into."""
    out = []
    for name, tp in field_types(cls).items():
        inner = _bare(tp)
        if dataclasses.is_dataclass(inner):
            out += numbers(inner, f"{prefix}{name}.")
        elif inner in (int, float):
            out.append(Number(f"{prefix}{name}", cls, name, inner is int))
    return out


NUMBERS = numbers()
TINY = ["tiny_gpt_pretrain", "tiny_moe_pretrain", "tiny_llava_pretrain"]  # recipes/catalog/tiny.py


def test_every_number_of_the_schema_has_a_range() -> None:
    assert len(NUMBERS) > 50 and {"model.num_layers", "model.vision.num_layers"} <= {
        n.path for n in NUMBERS
    }
    assert [n.path for n in NUMBERS if n.range is None] == []


# --- extreme values --------------------------------------------------------------------------
EXTREMES = [0, -1, 1, 2**31 - 1, 2**31, 2**32, 2**63, 2**64, 2**70, -(2**70)]
EXTREMES += [math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, 1e-300, 0.999999, 1e300, -1e300]
values = st.one_of(
    st.sampled_from(EXTREMES),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
)


def edges(number: Number) -> st.SearchStrategy[Any]:
    """The ends of the field's own range and just past them: the largest valid model, the
    smallest valid rate, one layer too many."""
    valid, step = number.range, 1 if number.integer else 1e-9
    ends = [valid.low, valid.low - step, valid.high, valid.high + step]
    return st.sampled_from([e for e in ends if math.isfinite(e)])


# The per-example bound: a check answers in milliseconds, the slowest valid one (10,000 layers that
# do not fit, so that the search for fixes runs) in about a second on this 2-core machine.
FAST = settings(
    deadline=timedelta(seconds=3),
    max_examples=400,
    derandomize=True,  # the same examples on every run: a failure reproduces
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _recipe_for(numbers: list[Number], draw: st.DrawFn) -> str:
    """A tiny recipe that has the section (only the LLaVA one has model.vision)."""
    if any(n.path.startswith("model.vision.") for n in numbers):
        return "tiny_llava_pretrain"
    return draw(st.sampled_from(TINY))


@st.composite
def checks(draw: st.DrawFn) -> tuple[str, list[tuple[Number, Any]], list[str]]:
    """A recipe, one to three (field, extreme or edge value) pairs, and the CLI's cluster options."""
    pairs = st.sampled_from(NUMBERS).flatmap(lambda n: st.tuples(st.just(n), values | edges(n)))
    changes = draw(st.lists(pairs, min_size=1, max_size=3, unique_by=lambda p: p[0].path))
    recipe = _recipe_for([n for n, _ in changes], draw)
    options = draw(st.sampled_from([[], ["--gpu", "h100"], ["--gpu", "a100-40g", "--json"]]))
    return recipe, changes, options


def _text(value: Any) -> str:
    return "None" if value is None else repr(value)


@FAST
@given(checks())
def test_recipes_check_answers_every_override_with_an_exit_code(
    case: tuple[str, list[tuple[Number, Any]], list[str]],
) -> None:
    recipe, changes, options = case
    argv = ["check", recipe, *(f"{n.path}={_text(v)}" for n, v in changes), *options]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(argv) in EXIT_CODES


@FAST
@given(checks())
def test_check_answers_every_value_set_in_python(
    case: tuple[str, list[tuple[Number, Any]], list[str]],
) -> None:
    """What no parser sees: a recipe function that sets the value itself."""
    recipe, changes, options = case
    found, cfg = resolve(recipe, [])
    for number, value in changes:
        setattr(number.node(cfg), number.name, value)
    cluster = job_cluster(found.cluster, None, JobSize(gpu=options[1] if options else None))
    report = check(cfg, cluster)
    assert report.exit_code in EXIT_CODES
    refused = {n.path for n, v in changes if out_of_range(n.section, n.name, v)}
    assert refused <= {p.field for p in report.problems}


def test_two_billion_layers_are_refused_at_once_in_a_fresh_process() -> None:
    """2**31 layers once built a list of 2**31 entries (16 GiB in ten minutes on a login node)."""
    done = children.run(
        [sys.executable, "-m", "recipes.cli", "check", "tiny_gpt_pretrain"]
        + ["model.num_layers=2147483648"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == EXIT_INVALID, done.stderr
    assert "model.num_layers: must be an integer in [1, 10000], got 2147483648" in done.stderr


# --- what check accepts, starts -----------------------------------------------------------------
# Fields the sample leaves alone: the run's length and side work (it trains one step, without
# evaluation, checkpoints or a time limit), the loader of Energon data, and sections the tiny
# model does not have (vision) or does not use (multi-latent attention).
UNSAMPLED = (
    "train.max_steps",
    "train.eval_",
    "checkpoint.",
    "logging.",
    "train.exit_duration_minutes",
    "data.num_workers",
    "data.shuffle_buffer_size",
    "data.max_samples_per_sequence",
    "data.prefetch_factor",
    "model.vision.",
    "model.q_lora_rank",
    "model.kv_lora_rank",
    "model.qk_",
    "model.v_head_dim",
)
SAMPLED = [n for n in NUMBERS if not n.path.startswith(UNSAMPLED)]


def plausible(number: Number, current: Any, rng: random.Random) -> Any:
    """A value of the field's range that a researcher might write: an edge of the range, or near
    the tiny model's own value (sizes at most twice it, so that a step stays a fraction of a
    second on the CPU)."""
    valid = number.range
    if number.integer:
        base = current if isinstance(current, int) and current > 0 else max(valid.low, 1)
        top = min(valid.high, 2 * base)
        picks = [valid.low, valid.low + 1, base, top, rng.randint(valid.low, max(valid.low, top))]
        return min(max(rng.choice(picks), valid.low), top)
    low = valid.low * (1 + 1e-9) + 1e-300 if valid.low_open else valid.low
    high = valid.high if math.isfinite(valid.high) else max(10 * (current or 1.0), 1.0)
    high = high * (1 - 1e-6) if valid.high_open else high
    picks = [low, high, current if current is not None else low, rng.uniform(low, high)]
    return rng.choice(picks)


def accepted_sample(run_dir: Path, seed: int, wanted: int) -> list[tuple[list[str], Any]]:
    """`wanted` (overrides, config) pairs that `check` accepts on one CPU rank, drawn with `seed`."""
    rng, found = random.Random(seed), []
    for _ in range(2000):
        cfg = tiny(run_dir / f"run{len(found)}", max_steps=1)
        cfg.scheduler.warmup_steps = 0  # warmup must end before decay: 0 of 1 step
        chosen = rng.sample(SAMPLED, rng.randint(1, 4))
        overrides = [
            f"{n.path}={_text(plausible(n, getattr(n.node(cfg), n.name), rng))}" for n in chosen
        ]
        try:
            apply_overrides(cfg, overrides)
        except ConfigError:
            continue
        if check(cfg, ONE_CPU).exit_code == EXIT_OK:
            found.append((overrides, cfg))
            if len(found) == wanted:
                break
    return found


@pytest.mark.timeout(120)
def test_what_check_accepts_on_the_cpu_trains_a_step(one_rank: None, tmp_path: Path) -> None:  # noqa: F811
    """8 seeded samples: each starts through `training.pretrain` (the ranks' own start-up, which
    re-checks the config) and its one step gives a finite loss."""
    from training.entry import pretrain

    sample = accepted_sample(tmp_path, seed=11, wanted=8)
    assert len(sample) == 8
    for overrides, cfg in sample:
        try:
            pretrain(cfg)
        except Exception as err:  # the checker accepted what cannot start: say which overrides
            raise AssertionError(f"accepted by check, failed at start-up: {overrides}") from err
        (loss,) = losses(Path(cfg.logging.run_dir))
        assert math.isfinite(loss), overrides
