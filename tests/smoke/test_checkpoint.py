"""Checkpoints and resume, end to end: real 2-process torchrun jobs of a tiny GPT on the CPU.

- Exact resume: 8 steps in one job == 4 steps, stop, resume, 4 steps, float for float (loss,
  grad norm and LR from metrics.jsonl), for DP=2 (distributed optimizer), TP=2, PP=2, LoRA,
  Megatron-FSDP, and indexed data made here (BPE tokenizer + JSONL -> .bin/.idx). The layouts'
  jobs are grouped (fixture `launched`): on two cores a launch's start-up costs as much as its
  training, so each phase of the chains is one torchrun launch of tests/smoke/run_many.py training
  every layout's config one after another (3 launches, not 3 per layout): the straight references,
  then the first halves, stopped by SIGUSR1 after step STOP_AT (run_many applies
  signal_at_step.py's patch to each), then the resumes. Each config keeps its own run and
  checkpoint directory, and each layout is its own test case on its own chain.
- In the same launches: the indexed straight run keeps its last two checkpoints and removes a
  stale .tmp folder, never loading it; a run with train.exit_duration_minutes saves before it
  exits.
- A job chain as Slurm runs it: job 1 gets SIGUSR1 (one rank only), saves and exits 0; job 2 is
  SIGKILLed while its final checkpoint is being written; job 3 resumes from job 1's checkpoint, never
  from the half-written one, and repeats job 2's losses exactly.
- The GPU's asynchronous save path, run on the CPU, publishes complete checkpoints that resume
  exactly.

The other tests kill processes or use another entry point, so each of their jobs is its own
`torchrun --standalone --nproc-per-node 2` with OMP_NUM_THREADS=1; signal_at_step.py and
async_save_on_cpu.py are test wrappers around `training.entry`.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.smoke.conftest import _env
from tests.smoke.run_many import Outcome, launch_many, read_metrics
from tests.smoke.signal_at_step import ENV as SIGNAL_AT_STEP_ENV
from tests.support import children
from training.checkpoint import dirs

pytestmark = pytest.mark.smoke

REPO = Path(__file__).resolve().parents[2]
STOP_ENTRY = Path(__file__).with_name("signal_at_step.py")
ASYNC_ENTRY = Path(__file__).with_name("async_save_on_cpu.py")

# A tiny GPT: 4 layers (2 per stage at PP=2), 4 heads / 2 KV groups (whole groups at TP=2).
BASE: dict[str, Any] = {
    "name": "ckpt_smoke",
    "model": {
        "num_layers": 4,
        "hidden_size": 64,
        "ffn_hidden_size": 256,
        "num_attention_heads": 4,
        "num_query_groups": 2,
        "seq_length": 64,
        "vocab_size": 512,
    },
    "optimizer": {"lr": 3e-3, "min_lr": 3e-4},
    "scheduler": {"warmup_steps": 2},
    "train": {"global_batch_size": 8, "micro_batch_size": 2, "max_steps": 20, "device": "cpu"},
    "checkpoint": {"save_interval": 100, "keep_last": 0},
    "logging": {"tensorboard": False, "progress_bar": False},
}


class Job:
    """One torchrun job (2 CPU processes) of a config, in its own run directory."""

    def __init__(self, tmp: Path, name: str, overrides: dict[str, Any] | None = None) -> None:
        self.tmp = tmp
        self.run_dir = tmp / name
        config = json.loads(json.dumps(BASE))
        for dotted, value in (overrides or {}).items():
            *path, leaf = dotted.split(".")
            node = config
            for key in path:
                node = node.setdefault(key, {})
            node[leaf] = value
        config["logging"]["run_dir"] = str(self.run_dir)
        self.config = tmp / f"{name}.yaml"
        self.config.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.logs: list[str] = []

    def env(self, stop_at: int | None = None, env: dict[str, str] | None = None) -> dict[str, str]:
        """The test environment (caches in tmp, OMP_NUM_THREADS=1), plus `env`; with `stop_at`,
        the variable that makes the last rank signal itself after that step."""
        full_env = _env(self.tmp) | (env or {})
        if stop_at is not None:
            full_env[SIGNAL_AT_STEP_ENV] = str(stop_at)
        return full_env

    def start(
        self,
        stop_at: int | None = None,
        env: dict[str, str] | None = None,
        script: Path | None = None,
        ignore_usr1: bool = False,
    ) -> subprocess.Popen:
        """Starts the job: `-m training.entry`, or a test wrapper `script` around it; with
        `ignore_usr1`, torchrun starts with SIGUSR1 ignored, as launchers/slurm.py starts it.
        It stops at the end of the test at the latest (tests/support/children.py)."""
        if stop_at is not None:
            script = STOP_ENTRY
        entry = [str(script)] if script else ["-m", "training.entry"]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        log = self.tmp / f"{self.run_dir.name}.{len(self.logs)}.log"
        self.logs.append(str(log))
        with log.open("w") as out:  # the child keeps its own copy of the handle
            return children.start(
                [*cmd, "--nproc-per-node", "2", *entry, "--config", str(self.config)],
                cwd=REPO,
                env=self.env(stop_at, env),
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_ignore_usr1 if ignore_usr1 else None,
            )

    def run(
        self,
        stop_at: int | None = None,
        env: dict[str, str] | None = None,
        script: Path | None = None,
    ) -> str:
        """Runs to the end; returns the job's output and fails the test on a non-zero exit."""
        proc = self.start(stop_at, env, script)
        try:
            returncode = proc.wait(timeout=600)
        finally:
            children.stop(proc)
        out = self.output()
        if returncode != 0:
            tail = "\n".join(out.splitlines()[-40:])
            pytest.fail(f"job exited {returncode}, log {self.logs[-1]}:\n{tail}")
        return out

    def output(self) -> str:
        return Path(self.logs[-1]).read_text(encoding="utf-8", errors="replace")

    def metrics(self) -> list[dict[str, Any]]:
        return read_metrics(self.run_dir)

    def latest_step(self) -> int | None:
        latest = dirs.latest_checkpoint(self.ckpt_dir)
        return None if latest is None else dirs.step_of(latest)


def _ignore_usr1() -> None:
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def trace(records: list[dict[str, Any]]) -> list[tuple]:
    """What must repeat bitwise: (step, loss, grad_norm, lr)."""
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in records]


def wait_for(condition: Any, what: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the job ended (exit {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and every worker at once, as a node failure would. (torchrun starts its
    workers in their own sessions, so a signal to its process group alone would not reach them.)"""
    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for p in tree:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=60)


def workers(proc: subprocess.Popen) -> list[psutil.Process]:
    return [
        p for p in psutil.Process(proc.pid).children() if "training.entry" in " ".join(p.cmdline())
    ]


LAYOUTS: dict[str, dict[str, Any]] = {
    "dp2": {},  # DP=2 with the distributed optimizer (dp_reshardable)
    "tp2": {"parallel.tensor_model_parallel_size": 2},
    "pp2": {"parallel.pipeline_model_parallel_size": 2},
    # LoRA: the checkpoint holds the adapters; the frozen base is rebuilt from the seed (no
    # pretrained_dir here), the adapters and their optimizer state come from the checkpoint.
    "lora_tp2": {"parallel.tensor_model_parallel_size": 2, "peft.scheme": "lora"},
    "lora_pp2": {"parallel.pipeline_model_parallel_size": 2, "peft.scheme": "lora"},
    # Megatron-FSDP: fsdp_dtensor checkpoints through torch DCP.
    "fsdp_dp2": {"parallel.use_megatron_fsdp": True},
    # Indexed data made here (the chains fixture adds data.path and data.tokenizer), saved at
    # every step and pruned to the last two.
    "indexed": {"data.kind": "indexed", "checkpoint.save_interval": 1, "checkpoint.keep_last": 2},
}
CHAIN_STEPS = 8  # past the 2 warmup steps on both sides of the stop
STOP_AT = 4
# train.exit_duration_minutes of the timed run: 6 ms, over after its first step.
EXIT_AFTER_MINUTES = 1e-4


def run_together(jobs: list[Job], stop_at: int | None = None) -> list[Outcome]:
    """The jobs' configs trained one after another in one 2-process launch of run_many (more if
    one fails: those after it go on in another); their outcomes, in order."""
    env = jobs[0].env(stop_at)
    outcomes = launch_many([job.config for job in jobs], 2, env, jobs[0].tmp / "launches")
    return [outcomes[job.config.stem] for job in jobs]


@dataclass
class Chain:
    """One layout's exact-resume chain: a straight CHAIN_STEPS reference, and a job stopped after
    step STOP_AT then resumed to CHAIN_STEPS; what each launch said of it, and what the first half
    left."""

    reference: Job
    chained: Job
    straight: Outcome
    first: Outcome
    after_first: tuple[int | None, int]  # the latest checkpoint's step, metrics records
    second: Outcome

    def check(self, outcome: Outcome, what: str) -> Outcome:
        assert outcome.error is None, outcome.failure(f"{self.chained.run_dir.name}, {what}")
        return outcome


@dataclass
class Launched:
    """What the chains' three launches trained: each layout's chain; the straight indexed run's
    stale .tmp folder (left there as a crashed job leaves one); the timed run, which trained
    first in the straight launch."""

    chains: dict[str, Chain]
    stale: Path
    timed: Job
    timed_outcome: Outcome


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Launched:
    """The layouts' chains: each phase one launch for all of them."""
    tmp = tmp_path_factory.mktemp("resume")
    tokenizer, prefix = _indexed_corpus(tmp)
    data = {"data.path": str(prefix), "data.tokenizer": str(tokenizer)}
    layouts = {n: o | (data if n == "indexed" else {}) for n, o in LAYOUTS.items()}
    steps = {"train.max_steps": CHAIN_STEPS}
    references = [Job(tmp, f"straight_{n}", layout | steps) for n, layout in layouts.items()]
    chained = [Job(tmp, f"chained_{n}", layout | steps) for n, layout in layouts.items()]
    timed = Job(tmp, "timed", {"train.exit_duration_minutes": EXIT_AFTER_MINUTES})
    # Left by a crashed job: complete-looking inside, but never published.
    stale = references[-1].ckpt_dir / (dirs.iter_name(99) + dirs.TMP_SUFFIX)
    stale.mkdir(parents=True)
    (stale / dirs.STATE_FILE).write_text("{}")
    timed_outcome, *straight = run_together([timed, *references])
    first = run_together(chained, stop_at=STOP_AT)
    after_first = [(job.latest_step(), len(job.metrics())) for job in chained]
    second = run_together(chained)
    parts = zip(references, chained, straight, first, after_first, second, strict=True)
    chains = {name: Chain(*chain) for name, chain in zip(LAYOUTS, parts, strict=True)}
    return Launched(chains, stale, timed, timed_outcome)


@pytest.fixture(scope="module")
def chains(launched: Launched) -> dict[str, Chain]:
    return launched.chains


@pytest.mark.parametrize("layout", LAYOUTS)
def test_resume_is_exact(chains: dict[str, Chain], layout: str) -> None:
    chain = chains[layout]
    reference, chained = chain.reference, chain.chained
    chain.check(chain.straight, "the straight run")
    first = chain.check(chain.first, f"stopped at step {STOP_AT}")
    assert f"exit signal: saving at step {STOP_AT}" in first.log
    assert chain.after_first == (STOP_AT, STOP_AT)  # latest checkpoint's step, metrics records
    second = chain.check(chain.second, "the resume")
    resumed = f"resumed from {chained.ckpt_dir / dirs.iter_name(STOP_AT)} at step {STOP_AT}"
    assert resumed in second.log
    assert len(reference.metrics()) == CHAIN_STEPS
    assert trace(chained.metrics()) == trace(reference.metrics())  # exact floats


def test_signal_then_kill_mid_save_then_resume(tmp_path: Path) -> None:
    job = Job(tmp_path, "chain", {"train.max_steps": 40})

    # Job 1: SIGUSR1 to one worker only; every rank stops at the same step, saves, exits 0.
    proc = job.start()
    wait_for(lambda: len(job.metrics()) >= 2, "step 2", proc)
    workers(proc)[-1].send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=300) == 0, job.output()[-3000:]
    stopped = job.metrics()[-1]["step"]
    assert stopped < 40, "the signal came too late to test anything"
    assert job.latest_step() == stopped
    assert f"exit signal: saving at step {stopped}" in job.output()

    # Job 2: resumes, trains to 40, and is killed while its final checkpoint is being written.
    seen = len(job.metrics())
    proc = job.start(env={"RECIPES_TEST_SLOW_SAVE": "300"})
    partial = job.ckpt_dir / (dirs.iter_name(40) + dirs.TMP_SUFFIX)
    wait_for(lambda: (partial / dirs.STATE_FILE).is_file(), "the final save", proc)
    kill_job(proc)
    killed_run = job.metrics()[seen:]
    assert [r["step"] for r in killed_run] == list(range(stopped + 1, 41))
    assert partial.is_dir() and not (job.ckpt_dir / dirs.iter_name(40)).exists()
    assert job.latest_step() == stopped  # the half-written checkpoint is not the latest

    # Job 3: resumes from job 1's checkpoint, removes the stale .tmp, repeats job 2 exactly.
    out = job.run()
    assert f"resumed from {job.ckpt_dir / dirs.iter_name(stopped)} at step {stopped}" in out
    assert not partial.exists()
    assert job.latest_step() == 40
    # The resume dropped job 2's records past the checkpoint: one record per step, as one run.
    assert [r["step"] for r in job.metrics()] == list(range(1, 41))
    assert trace([r for r in job.metrics() if r["step"] > stopped]) == trace(killed_run)


def _indexed_corpus(root: Path) -> tuple[Path, Path]:
    """A BPE tokenizer and a Megatron .bin/.idx dataset, both made here (see tests/unit/data/test_data.py)."""
    import random

    from data.indexed import jsonl_to_indexed
    from data.tools.make_tokenizer import train_bpe_tokenizer

    words = "the model trains on tokens while gradients flow through every layer".split()
    rng = random.Random(0)
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 60))) for _ in range(300)]
    tokenizer = train_bpe_tokenizer(texts=texts, vocab_size=512, out=root / "tok.json")
    jsonl = root / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    prefix = root / "data" / "docs"
    jsonl_to_indexed(jsonl, tokenizer, prefix, append_eod=True)
    return Path(tokenizer), prefix


def test_keep_last_prunes_and_a_stale_tmp_is_never_loaded(launched: Launched) -> None:
    """The indexed layout's straight run saves at every step and keeps the last two; the .tmp
    folder a crashed job left is removed, never loaded. (Its exact resume is
    test_resume_is_exact[indexed].)"""
    chain = launched.chains["indexed"]
    reference = chain.check(chain.straight, "the straight run")
    assert "resumed from" not in reference.log and not launched.stale.exists()
    ckpt_dir = chain.reference.ckpt_dir
    kept = sorted(p.name for p in ckpt_dir.iterdir() if p.name != dirs.LOCK_FILE)
    last = [dirs.iter_name(CHAIN_STEPS - 1), dirs.iter_name(CHAIN_STEPS)]
    assert kept == [*last, dirs.LATEST_FILE]
    assert (ckpt_dir / dirs.LATEST_FILE).read_text().strip() == dirs.iter_name(CHAIN_STEPS)


def test_exit_duration_saves_and_exits(launched: Launched) -> None:
    """train.exit_duration_minutes ends the loop early, at a step boundary, with a checkpoint."""
    outcome, job = launched.timed_outcome, launched.timed
    assert outcome.error is None, outcome.failure("the timed run")
    steps = [r["step"] for r in job.metrics()]
    assert steps and steps[-1] < 20
    assert job.latest_step() == steps[-1]


def test_async_save_publishes_complete_checkpoints(tmp_path: Path) -> None:
    """The GPU's asynchronous save (run on the CPU): background writes, publication when they are
    done, keep_last; a checkpoint written that way resumes exactly."""
    overrides = {"train.max_steps": 6, "checkpoint.save_interval": 2, "checkpoint.keep_last": 2}
    job = Job(tmp_path, "async", overrides)
    out = job.run(script=ASYNC_ENTRY)
    for step in (2, 4, 6):
        assert f"saved {job.ckpt_dir / dirs.iter_name(step)} (step {step})" in out
    saved = sorted(p.name for p in job.ckpt_dir.iterdir() if p.name != dirs.LOCK_FILE)
    assert saved[0] == dirs.iter_name(4)  # keep_last
    straight = job.metrics()
    # Roll `latest` back by hand, as a user would, and resume synchronously from step 4.
    (job.ckpt_dir / dirs.LATEST_FILE).write_text(dirs.iter_name(4) + "\n")
    assert "at step 4" in job.run()
    # Steps 5 and 6 were trained again: their records replace the first run's, equal to them.
    assert [r["step"] for r in job.metrics()] == list(range(1, 7))
    assert trace(job.metrics()) == trace(straight)


@pytest.mark.parametrize("path", ["sync", "async"])
def test_exit_signal_to_every_process_after_interval_saves(tmp_path: Path, path: str) -> None:
    """Slurm's `--signal=USR1@margin` (and `scancel --signal`) reaches every process of the job:
    torchrun (started with USR1 ignored, as launchers/slurm.py does), the ranks and, for
    asynchronous saves, the helper that Megatron-Core's checkpoint writer started at the first save
    (a synchronous save starts none). After several interval saves the exit save still writes the
    step where the job stopped."""
    job = Job(tmp_path, path, {"train.max_steps": 5000, "checkpoint.save_interval": 4})
    proc = job.start(script=ASYNC_ENTRY if path == "async" else None, ignore_usr1=True)
    wait_for(lambda: (job.latest_step() or 0) >= 8, "two interval saves", proc)
    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    helpers = [p for p in tree if p.pid != proc.pid and p not in workers(proc)]
    if path == "sync":
        assert not helpers, f"a synchronous save started helper processes: {helpers}"
    else:
        assert helpers, "no checkpoint helper process to signal: the test would prove nothing"
    for p in tree:
        try:
            p.send_signal(signal.SIGUSR1)
        except psutil.NoSuchProcess:
            pass
    assert proc.wait(timeout=300) == 0, job.output()[-3000:]
    out = job.output()
    stopped = job.metrics()[-1]["step"]
    assert f"exit signal: saving at step {stopped}" in out
    assert job.latest_step() == stopped
    assert not list(job.ckpt_dir.glob("*" + dirs.TMP_SUFFIX))
    for helper in helpers:
        assert not psutil.pid_exists(helper.pid) or helper.status() == psutil.STATUS_ZOMBIE
