"""Each correction of bench/data/published_perf.csv against the evidence bench/published_corrections.py
names: the summary's own GA column, or a neighbouring release's figure of the corrected layout."""

from __future__ import annotations

import csv
import re

import pytest

from bench.published_corrections import CORRECTIONS, corrected
from bench.published_table import TABLE, _int, load, release

LAYOUT = ("tp", "pp", "cp", "vp", "ep", "etp", "mbs", "fsdp")


@pytest.fixture(scope="module")
def rows() -> dict[str, dict[str, str]]:
    with TABLE.open(newline="") as f:
        return {r["id"]: r for r in csv.DictReader(f)}


def _ga_holds(row: dict[str, str]) -> bool:
    """GBS = GA x DP x MBS, with DP the GPUs over TP, PP and CP."""
    ga = int(re.search(r"GA=(\d+)", row["notes"]).group(1))  # type: ignore[union-attr]
    dp = int(row["gpus"]) // (_int(row["tp"], 1) * _int(row["pp"], 1) * _int(row["cp"], 1))
    return ga * dp * _int(row["mbs"], 1) == int(row["gbs"])


@pytest.mark.parametrize("run_id", sorted(CORRECTIONS))
def test_a_correction_changes_only_the_layout_and_has_its_evidence(
    run_id: str, rows: dict[str, dict[str, str]]
) -> None:
    fix, printed = CORRECTIONS[run_id], rows[run_id]
    assert set(fix.columns) <= set(LAYOUT)
    assert any(printed[k] != v for k, v in fix.columns.items())  # it corrects something
    row = corrected(printed)
    if fix.neighbour is None:  # the summary's own accumulation count disagrees with its MBS
        assert not _ga_holds(printed) and _ga_holds(row)
        return
    other = rows[fix.neighbour]
    same = ("model", "system", "gpus", "precision", "gbs", "seq")
    assert all(other[k] == row[k] for k in same)
    assert release(other["software"]) != release(row["software"])
    assert all(other[k] == row[k] for k in ("tp", "pp", "cp", "vp", "ep", "mbs"))
    figure, beside = float(row["tokens_per_s_per_gpu"]), float(other["tokens_per_s_per_gpu"])
    assert abs(figure / beside - 1) <= 0.05


def test_the_priced_runs_carry_the_corrected_layout(rows: dict[str, dict[str, str]]) -> None:
    runs = {r.id: r for r in load()[0]}
    for run_id in CORRECTIONS:
        row = corrected(rows[run_id])
        vp = _int(row["vp"], 1)
        layout = (
            _int(row["tp"], 1),
            _int(row["pp"], 1),
            vp if vp > 1 else None,
            _int(row["cp"], 1),
        )
        assert runs[run_id].layout == (*layout, _int(row["ep"], 1), _int(row["mbs"], 1)), run_id
    assert corrected({"id": "not corrected", "mbs": "2"}) == {"id": "not corrected", "mbs": "2"}
