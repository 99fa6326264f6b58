"""tests/smoke/run_many.py `split_outcomes`: a launch's output, cut at the runner's own lines, gives
each config its part and names the one the launch stopped in (the runner's lines as it prints them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.smoke.run_many import MARK, split_outcomes

DIRS = {name: Path(f"/runs/{name}") for name in ("a", "b", "c")}


def test_done_configs_get_their_lines_and_the_stopped_one_its_error() -> None:
    output = "\n".join(
        [
            "torchrun starts",
            f"{MARK} start a",
            "step 1/3 of a",
            f"{MARK} done a in 12.5 s",
            f"{MARK} start b",
            "Traceback of b",
        ]
    )
    outcomes = split_outcomes(output, ["a", "b", "c"], DIRS, failed=True, ended="exit 1")
    assert sorted(outcomes) == ["a", "b"]  # c goes on in the next launch
    assert outcomes["a"].error is None and outcomes["a"].log == "step 1/3 of a"
    assert outcomes["b"].error == "the launch ended in it (exit 1)"
    assert outcomes["b"].log == "Traceback of b"


def test_a_launch_that_fails_after_its_last_config_fails_that_config() -> None:
    output = f"{MARK} start a\n{MARK} done a in 1.0 s\nSegmentation fault"
    outcomes = split_outcomes(output, ["a"], DIRS, failed=True, ended="exit -11")
    assert outcomes["a"].error == "the launch failed after it, outside any config (exit -11)"


def test_a_launch_takes_its_configs_device_and_refuses_two(tmp_path: Path) -> None:
    """NCCL for GPU configs (gloo and the CPU mode would leave the model on the CPU), one device
    per launch."""
    from tests.smoke.run_many import launch_device

    def config(name: str, device: str) -> str:
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"name: {name}\ntrain:\n  device: {device}\n")
        return str(path)

    assert launch_device([config("a", "cuda"), config("b", "cuda")]) == "cuda"
    assert launch_device([config("c", "cpu")]) == "cpu"
    with pytest.raises(ValueError, match="one device.*'d': 'cpu'.*'e': 'cuda'"):
        launch_device([config("d", "cpu"), config("e", "cuda")])
