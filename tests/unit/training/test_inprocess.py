"""resilience.inprocess_restart where nvidia-resiliency-ext cannot serve it: refused before launch
(launchers/inputs.py) and on the ranks (training/inprocess.py), each naming the field and the fix.
The restart itself runs in tests/smoke/test_resilience_cpu.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from config.tree import ConfigError, apply_overrides
from launchers.inputs import check_inputs
from launchers.profile import Profile
from recipes.registry import get


def restartable():
    cfg = get("tiny_gpt_pretrain").config()
    return apply_overrides(cfg, ["resilience.inprocess_restart=true"])


def launch_problems(tmp_path: Path) -> dict[str, str]:
    try:
        check_inputs(restartable(), Profile(executor="local"), tmp_path)
    except ConfigError as err:
        return dict(err.problems)
    return {}


def test_the_launcher_refuses_it_without_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "nvidia_resiliency_ext", None)  # find_spec: not installed
    found = launch_problems(tmp_path)
    assert set(found) == {"resilience.inprocess_restart"}, found
    message = found["resilience.inprocess_restart"]
    assert "nvidia_resiliency_ext is not installed" in message
    assert "pip install .[resiliency]" in message
    assert "set resilience.inprocess_restart=false" in message


def test_the_launcher_refuses_a_version_that_breaks_the_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed but broken, as 0.4.1 is beside megatron-core: the ranks' Python is asked."""
    fake = tmp_path / "site" / "nvidia_resiliency_ext"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise AttributeError('no __version__ in this build')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    found = launch_problems(tmp_path)
    message = found["resilience.inprocess_restart"]
    assert "AttributeError: no __version__ in this build" in message, message
    assert "pip install .[resiliency]" in message


def test_the_ranks_refuse_it_without_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    from training.inprocess import import_inprocess

    monkeypatch.setitem(sys.modules, "nvidia_resiliency_ext", None)
    with pytest.raises(ConfigError) as err:
        import_inprocess()
    ((field, message),) = err.value.problems
    assert field == "resilience.inprocess_restart"
    assert "does not import with megatron-core here (ModuleNotFoundError" in message
    assert "set resilience.inprocess_restart=false" in message


def test_off_by_default_and_nothing_is_checked(tmp_path: Path) -> None:
    cfg = get("tiny_gpt_pretrain").config()
    assert cfg.resilience.inprocess_restart is False
    check_inputs(cfg, Profile(executor="local"), tmp_path)
