"""Generated files match their golden copies; `make golden` refreshes them after a deliberate change."""

from __future__ import annotations

import pytest

from tests.support.golden import CHOICES_BEGIN, GOLDEN, README, all_goldens, readme_with_choices

GOLDENS = all_goldens()


@pytest.mark.parametrize("path", sorted(GOLDENS), ids=lambda p: str(p.relative_to(GOLDEN)))
def test_matches_golden(path) -> None:
    assert path.exists(), f"{path} is missing: run `make golden`"
    assert path.read_text() == GOLDENS[path], (
        f"{path.name} differs from the code: review, then `make golden`"
    )


def test_no_stale_goldens() -> None:
    on_disk = {p for p in GOLDEN.rglob("*") if p.is_file()}
    assert on_disk <= set(GOLDENS), (
        f"stale golden files: {sorted(on_disk - set(GOLDENS))}; run `make golden`"
    )


def test_readme_lists_the_schemas_choices() -> None:
    """The README's table of valid values comes from the schema (Literal fields and registries)."""
    text = README.read_text()
    assert CHOICES_BEGIN in text
    assert text == readme_with_choices(text), "README's field table is stale: run `make golden`"
