"""Every catalog recipe, shrunk, trains 3 steps on the CPU with its own layout scaled to 4 processes.

Each recipe trains the config that `recipes run NAME --shrink --executor local --device cpu
--gpus-per-node W` hands its ranks, W = min(4, its published world size): all of them, none
skipped. Sequence parallel trains as it is (training/cpu_mode.py); what only a GPU runs (context
parallel, FP8/FP4, the alltoall dispatcher) is replaced by `cpu_substitutes`, as the command does.

Grouped, because on a small machine process start-up costs more than 3 steps of a shrunk model
(Python and NeMo-Run in the CLI, torchrun, every rank importing torch and Megatron-Core):

- `tiny_gpt_pretrain` alone goes through the user's whole command (NeMo-Run's LocalExecutor,
  torchrun, `python -m training.entry`; the last line `run directory: PATH`), and the config that
  command wrote must be the one `resolve_shrunk` builds here: that keeps the grouped path honest.
- Every other recipe is resolved here, in the pytest process, as recipes/launch.py `run_command`
  resolves it, into a YAML file. The recipes of one world size then train one after another in a
  single torchrun launch of tests/smoke/run_many.py (its `launch_many`): one gloo group, and each
  run builds and tears down its own Megatron-Core groups, into its own logging.run_dir.

The launches run once per session (only for the recipes selected), and the test stays one case per
recipe, asserting on the metrics.jsonl of the config it resolves to. Recipes that differ only in
what the CPU cannot run resolve to the same config (the FP8 variant of a BF16 recipe, once FP8 is
substituted; a 1B and a 3B model shrunk alike): such a config trains once, for all of them
(`same_run`). A recipe that raises ends its launch: it fails alone, with its part of the log, and
the recipes after it go on in a new launch.
"""

from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

from config.hardware import Cluster
from config.rules import validate
from config.schema import TrainingConfig
from config.tree import apply_overrides, to_dict, write_yaml
from launchers.env import plan_env
from launchers.inputs import check_inputs
from launchers.local import process_env
from launchers.profile import Profile
from recipes.registry import all_recipes
from recipes.shrink import cpu_substitutes, fit_to_world, shrink
from tests.smoke.conftest import _env
from tests.smoke.run_many import Outcome, launch_many, read_metrics
from tests.support import children

pytestmark = pytest.mark.smoke
REPO = Path(__file__).resolve().parents[2]
MAX_PROCESSES = 4  # on 2 cores: enough for TP x PP = 2 x 2 or EP 4, still quick
CLI_RECIPE = "tiny_gpt_pretrain"  # the one recipe launched through `recipes run`
SECONDS_PER_RECIPE = 300  # a launch's time limit: this much per recipe in it (2 cores, 4 ranks)
TEST = "test_shrunk_recipe_trains_on_cpu"


def world_for(name: str) -> int:
    return min(MAX_PROCESSES, all_recipes()[name].cluster.world_size)


def cpu_cluster(world: int) -> Cluster:
    """The cluster `recipes run --device cpu --gpus-per-node W` sizes for a GPU recipe."""
    return Cluster(num_nodes=1, gpus_per_node=world, gpu="cpu")


def resolve_shrunk(name: str, world: int, overrides: list[str]) -> TrainingConfig:
    """What `recipes run NAME --shrink --device cpu --gpus-per-node W OVERRIDES` hands its ranks,
    in run_command's order: device, shrink, CPU substitutes, fit to the world, then the overrides."""
    cfg = all_recipes()[name].config()
    cfg.train.device = "cpu"
    cfg = shrink(cfg)
    cpu_substitutes(cfg)
    fit_to_world(cfg, world)
    return apply_overrides(cfg, overrides)


def test_every_shrunk_recipe_passes_the_checker_on_cpu() -> None:
    """Torch-free and quick: no recipe, shrunk for the CPU, is left with a problem."""
    refused = {}
    for name in sorted(all_recipes()):
        world = world_for(name)
        problems = validate(resolve_shrunk(name, world, []), cpu_cluster(world))
        if problems:
            refused[name] = [f"{p.field}: {p.message}" for p in problems]
    assert refused == {}


def data_overrides(name: str, folder: Path) -> list[str]:
    """Synthetic data in `folder` for the recipes that read files (Energon images, SFT and chat
    JSONL)."""
    kind = all_recipes()[name].config().data.kind
    if kind == "energon":
        from data.tools.synthetic_vlm import make_synthetic_vlm

        make_synthetic_vlm(folder, samples=32)
        return [f"data.path={folder}", f"data.tokenizer={folder / 'tokenizer.json'}"]
    if kind == "sft":  # arithmetic Q&A (shrink drops the pretrained weights)
        from data.tools.synthetic_sft import make_synthetic_sft

        jsonl = make_synthetic_sft(folder, samples=200)
        return [f"data.path={jsonl}", f"data.tokenizer={jsonl.parent / 'tokenizer.json'}"]
    if kind == "chat":  # arithmetic conversations and a ChatML tokenizer folder
        from data.tools.synthetic_chat import make_synthetic_chat

        jsonl = make_synthetic_chat(folder / "chat.jsonl", samples=200, tokenizer=folder / "tok")
        return [f"data.path={jsonl}", f"data.tokenizer={folder / 'tok'}"]
    return []


def same_run(cfg: TrainingConfig) -> str:
    """What two recipes' resolved configs must share to train alike: all of it but the run's
    name and folder."""
    data = to_dict(cfg)
    data.pop("name")
    data["logging"].pop("run_dir")
    return yaml.safe_dump(data, sort_keys=True)


class GroupedRuns:
    """The selected recipes (but CLI_RECIPE), launched once per world size on first use; a
    recipe whose resolved config another one already has gets that one's outcome."""

    def __init__(self, root: Path, selected: set[str]) -> None:
        self.root, self.selected = root, selected
        self.outcomes: dict[str, Outcome] = {}
        self.trained_as: dict[str, str] = {}  # recipe -> the recipe whose run it shares

    def outcome(self, name: str) -> Outcome:
        if name not in self.trained_as:
            self._run_group(world_for(name), must_include=name)
        return self.outcomes[self.trained_as[name]]

    def _run_group(self, world: int, must_include: str) -> None:
        # Energon recipes first: their loader forks DataLoader workers, and forked from a process
        # that has already trained ~25 recipes (threads, gloo groups and allocator state of every
        # earlier run) those workers segfaulted, on every rank, in two full runs on 2026-11-24;
        # the same recipes as the first of a launch pass. `recipes run` trains one recipe per
        # process, so only this grouped harness meets that state.
        names = sorted(
            (
                n
                for n in self.selected | {must_include}
                if n != CLI_RECIPE and n not in self.outcomes and world_for(n) == world
            ),
            key=lambda n: (all_recipes()[n].config().data.kind != "energon", n),
        )
        first: dict[str, str] = {}  # same_run -> the recipe that trains it
        configs = []
        for name in names:
            cfg = self._resolve(name, world)
            self.trained_as[name] = first.setdefault(same_run(cfg), name)
            if self.trained_as[name] == name:
                configs.append(write_yaml(cfg, self.root / f"w{world}" / f"{name}.yaml"))
        self.outcomes |= launch_many(
            configs, world, self._env(configs), self.root, SECONDS_PER_RECIPE
        )

    def _resolve(self, name: str, world: int) -> TrainingConfig:
        """What `recipes run` would write to <run dir>/config.yaml, checked as it checks."""
        folder = self.root / f"w{world}" / name
        folder.mkdir(parents=True, exist_ok=True)
        overrides = [f"logging.run_dir={folder / 'run'}", *data_overrides(name, folder / "data")]
        cfg = resolve_shrunk(name, world, overrides)
        check_inputs(cfg, Profile(executor="local"), REPO)
        return cfg

    def _env(self, configs: list[Path]) -> dict[str, str]:
        """The test environment plus what the local executor adds for each config (the same
        CPU defaults for all: torchrun's log level, CUDA_DEVICE_MAX_CONNECTIONS for TP)."""
        env = _env(self.root)
        for path in configs:
            cfg = resolve_from(path)
            env |= process_env(plan_env(cfg, {}, {}, env), env)
        return env


def resolve_from(path: Path) -> TrainingConfig:
    from training.entry import load_config  # torch-free: config.tree and yaml only

    return load_config(str(path), [])


@pytest.fixture(scope="session")
def grouped_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> GroupedRuns:
    selected = {
        item.callspec.params["name"]
        for item in request.session.items
        if getattr(item, "originalname", None) == TEST and hasattr(item, "callspec")
    }
    return GroupedRuns(tmp_path_factory.mktemp("catalog"), selected)


def run_user_command(name: str, world: int, tmp_path: Path) -> Path:
    """`recipes run NAME --shrink --executor local --device cpu --gpus-per-node W`; its run dir."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "recipes", "run", name, "--shrink", "--executor", "local"]
    overrides = [f"logging.run_dir={run_dir}", *data_overrides(name, tmp_path / "data")]
    cmd += ["--device", "cpu", "--gpus-per-node", str(world), *overrides]
    env = os.environ | {"OMP_NUM_THREADS": "1", "NEMORUN_HOME": str(tmp_path / "nemo_run")}
    proc = children.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"run directory: (.+)", last)
    assert match, f"last line was {last!r}"
    assert Path(match.group(1)) == run_dir
    # The grouped recipes train what resolve_shrunk builds: it must be what the command runs.
    written = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    assert written == to_dict(resolve_shrunk(name, world, overrides))
    return run_dir


@pytest.mark.timeout(SECONDS_PER_RECIPE * len(all_recipes()))  # the first case runs its group
@pytest.mark.parametrize("name", sorted(all_recipes()))
def test_shrunk_recipe_trains_on_cpu(name: str, grouped_runs: GroupedRuns, tmp_path: Path) -> None:
    world = world_for(name)
    if name == CLI_RECIPE:
        run_dir = run_user_command(name, world, tmp_path)
    else:
        outcome = grouped_runs.outcome(name)
        assert outcome.error is None, outcome.failure(name)
        run_dir = outcome.run_dir
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in records)
