"""launchers/inputs.py: a missing data file, tokenizer or checkpoint stops `recipes run` before
anything is launched or queued; what this machine cannot see is left to the job."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from config.tree import ConfigError, apply_overrides
from launchers.inputs import check_inputs, input_paths
from launchers.profile import Profile
from recipes.registry import get
from tests.support import children

LOCAL = Profile(executor="local")


def cfg_with(*overrides: str):
    cfg = get("tiny_gpt_pretrain").config()
    apply_overrides(cfg, list(overrides))
    return cfg


def problems(cfg, profile: Profile, cwd: Path) -> list[tuple[str, str]]:
    try:
        check_inputs(cfg, profile, cwd)
    except ConfigError as err:
        return err.problems
    return []


def test_what_each_data_kind_reads() -> None:
    cfg = cfg_with("data.kind=indexed", "data.path=0.7 /d/a 0.3 s3://bucket/b", "data.tokenizer=/t")
    assert input_paths(cfg) == [
        ("data.tokenizer", "/t"),
        ("data.path", "/d/a.bin"),
        ("data.path", "/d/a.idx"),
    ]
    cfg = cfg_with("data.kind=sft", "data.path=x.jsonl", "checkpoint.pretrained_dir=/ck")
    assert input_paths(cfg) == [("data.path", "x.jsonl"), ("checkpoint.pretrained_dir", "/ck")]
    assert input_paths(cfg_with()) == []  # mock data reads nothing


def test_local_paths_are_looked_up_from_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "tok.json").write_text("{}")
    (tmp_path / "train.jsonl").write_text('{"prompt": "q", "response": "a"}\n')
    cfg = cfg_with("data.kind=sft", "data.path=train.jsonl", "data.tokenizer=tok.json")
    assert problems(cfg, LOCAL, tmp_path) == []
    cfg = cfg_with("data.kind=sft", "data.path=trian.jsonl", "data.tokenizer=tok.json")
    [(field, message)] = problems(cfg, LOCAL, tmp_path)
    assert field == "data.path" and f"on this machine {tmp_path / 'trian.jsonl'}" in message
    bare = Profile(executor="slurm-bare", workdir=str(tmp_path))
    assert (
        problems(
            cfg_with("data.kind=sft", "data.path=train.jsonl", "data.tokenizer=tok.json"),
            bare,
            Path("/"),
        )
        == []
    )


def test_indexed_prefix_needs_both_files(tmp_path: Path) -> None:
    (tmp_path / "web.bin").write_bytes(b"")
    cfg = cfg_with(
        "data.kind=indexed", f"data.path={tmp_path / 'web'}", f"data.tokenizer={tmp_path}"
    )
    [(field, message)] = problems(cfg, LOCAL, tmp_path)
    assert field == "data.path" and "web.idx does not exist" in message


def test_containers_are_looked_into_through_the_mounts(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    profile = Profile(
        executor="slurm", container_image="img.sqsh", mounts=[f"{tmp_path}:/lustre/llm"]
    )
    ok = cfg_with("checkpoint.pretrained_dir=/lustre/llm/ckpt")
    assert problems(ok, profile, Path("/")) == []
    typo = cfg_with("checkpoint.pretrained_dir=/lustre/llm/ckpts")
    [(field, message)] = problems(typo, profile, Path("/"))
    assert field == "checkpoint.pretrained_dir" and str(tmp_path / "ckpts") in message
    inside_the_image = cfg_with("checkpoint.pretrained_dir=/workspace/ckpt")
    assert problems(inside_the_image, profile, Path("/")) == []
    # load_dir is a host path: the launcher maps it into the container itself.
    (tmp_path / "host" / "ckpt").mkdir(parents=True)
    profile = Profile(
        executor="slurm", container_image="i.sqsh", mounts=[f"{tmp_path}/host:{tmp_path}/ctr"]
    )
    host_path = cfg_with(f"checkpoint.load_dir={tmp_path}/host/ckpt")
    assert problems(host_path, profile, Path("/")) == []
    container_path = cfg_with(f"checkpoint.load_dir={tmp_path}/ctr/ckpt")
    assert [f for f, _ in problems(container_path, profile, Path("/"))] == ["checkpoint.load_dir"]


def test_a_filesystem_this_machine_lacks_is_left_to_a_slurm_job(tmp_path: Path) -> None:
    cfg = cfg_with("checkpoint.load_dir=/no-such-fs-here/runs/x/checkpoints")
    assert problems(cfg, Profile(executor="slurm-bare"), tmp_path) == []
    # The local executor's ranks run here: missing here is missing for them, top folder or not.
    fields = [f for f, _ in problems(cfg, LOCAL, tmp_path)]
    assert fields == ["checkpoint.load_dir"]


def test_local_folders_the_ranks_write_must_be_writable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    cfg = cfg_with(f"logging.run_dir={blocker / 'run'}", f"checkpoint.save_dir={blocker / 'ck'}")
    found = dict(problems(cfg, LOCAL, tmp_path))
    assert set(found) == {"logging.run_dir", "checkpoint.save_dir"}
    assert "cannot be created in" in found["logging.run_dir"]
    assert problems(cfg_with(f"logging.run_dir={tmp_path / 'new' / 'run'}"), LOCAL, tmp_path) == []


@pytest.mark.parametrize(
    ("kind", "lines", "words"),
    [
        ("sft", ['{"prompt": "a", "response": "b"}', '{"prompt": "a"}'], ":2: no 'response'"),
        ("sft", ['{"prompt": "a", "response": "b"}', "{oops"], ":2: not JSON"),
        ("sft", [""], "holds no sft record"),
        ("chat", ['{"messages": [{"role": "user", "content": "hi"}]}'], ":1: no assistant"),
        ("chat", ['{"messages": [{"role": "bot", "content": "x"}]}'], "role 'bot' is not one of"),
    ],
)
def test_a_bad_sft_or_chat_line_is_named_before_launch(
    tmp_path: Path, kind: str, lines: list[str], words: str
) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    found = dict(problems(cfg_with(f"data.kind={kind}", f"data.path={path}"), LOCAL, tmp_path))
    assert words in found.get("data.path", ""), found
    good = '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}'
    path.write_text(good if kind == "chat" else '{"prompt": "q", "response": "a"}')
    assert "data.path" not in dict(
        problems(cfg_with(f"data.kind={kind}", f"data.path={path}"), LOCAL, tmp_path)
    )


def test_read_only_data_needs_an_index_cache_dir(tmp_path: Path, monkeypatch) -> None:
    """Megatron writes its index caches beside the data unless data.index_cache_dir moves them."""
    import os

    data = tmp_path / "data"
    data.mkdir()
    for ext in (".bin", ".idx"):
        (data / f"web{ext}").write_bytes(b"")
    real_access = os.access

    def read_only_data(path, mode):  # as root chmod does not stop writes: deny them here
        if str(path).startswith(str(data)) and mode & os.W_OK:
            return False
        return real_access(path, mode)

    monkeypatch.setattr("launchers.inputs.os.access", read_only_data)
    beside = cfg_with("data.kind=indexed", f"data.path={data / 'web'}")
    found = dict(problems(beside, LOCAL, tmp_path))
    assert set(found) == {"data.index_cache_dir"}
    assert f"cannot be created in {data}" in found["data.index_cache_dir"]
    assert "set data.index_cache_dir" in found["data.index_cache_dir"]
    moved = cfg_with(
        "data.kind=indexed", f"data.path={data / 'web'}", f"data.index_cache_dir={tmp_path / 'c'}"
    )
    assert problems(moved, LOCAL, tmp_path) == []


def test_wandb_asked_for_but_not_installed_is_refused(tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    found = dict(problems(cfg_with("logging.wandb_project=demo"), LOCAL, tmp_path))
    assert "pip install wandb" in found["logging.wandb_project"]
    offline = cfg_with("logging.wandb_project=demo", "logging.wandb_mode=disabled")
    assert problems(offline, LOCAL, tmp_path) == []


def test_a_tokenizer_larger_than_the_model_is_refused(tmp_path: Path) -> None:
    from data.tokenizer import load_tokenizer
    from data.tools.make_tokenizer import train_bpe_tokenizer

    tok = train_bpe_tokenizer(
        texts=["a tokenizer of some size"] * 5, vocab_size=300, out=tmp_path / "t.json"
    )
    size = load_tokenizer(tok).vocab_size
    (tmp_path / "train.jsonl").write_text('{"prompt": "q", "response": "a"}\n')
    sft = ("data.kind=sft", f"data.path={tmp_path / 'train.jsonl'}", f"data.tokenizer={tok}")
    [(field, message)] = problems(cfg_with(*sft, f"model.vocab_size={size - 1}"), LOCAL, tmp_path)
    assert field == "data.tokenizer"
    assert f"{tok} has {size} ids but model.vocab_size={size - 1}" in message
    assert f"raise model.vocab_size to at least {size}" in message
    assert problems(cfg_with(*sft, f"model.vocab_size={size}"), LOCAL, tmp_path) == []
    # An HF folder: tokens that tokenizer_config.json adds count too.
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(tok.read_text())
    added = {"added_tokens_decoder": {str(size + 9): {"content": "<|tool|>", "special": True}}}
    (folder / "tokenizer_config.json").write_text(json.dumps(added))
    hf = cfg_with(*sft[:2], f"data.tokenizer={folder}", f"model.vocab_size={size}")
    [(field, message)] = problems(hf, LOCAL, tmp_path)
    assert f"has {size + 10} ids" in message


def test_a_tokenizer_config_nested_too_deep_stops_neither_check(tmp_path: Path) -> None:
    """tokenizer_config.json nested deeper than Python's JSON reader follows: the launcher counts
    tokenizer.json's ids alone and the checker finds no chat template there, no RecursionError."""
    from config.hf import tokenizer_size
    from config.rules.data import has_chat_template
    from data.tools.make_tokenizer import train_bpe_tokenizer

    folder = tmp_path / "hf"
    folder.mkdir()
    tok = train_bpe_tokenizer(texts=["words"] * 5, vocab_size=300, out=folder / "tokenizer.json")
    size = tokenizer_size(tok)
    (folder / "tokenizer_config.json").write_text("[" * 100_000 + "]" * 100_000)
    assert tokenizer_size(folder) == size and not has_chat_template(folder)
    (tmp_path / "train.jsonl").write_text('{"prompt": "q", "response": "a"}\n')
    sft = ("data.kind=sft", f"data.path={tmp_path / 'train.jsonl'}", f"data.tokenizer={folder}")
    assert problems(cfg_with(*sft, f"model.vocab_size={size}"), LOCAL, tmp_path) == []


def test_the_launcher_and_the_ranks_refuse_a_large_tokenizer_with_one_message(
    tmp_path: Path,
) -> None:
    """The check before launch (tokenizer.json read without torch) and the ranks' (the loaded
    tokenizer, building SFT rows or pretraining datasets) give the same field and message."""
    pytest.importorskip("torch")
    from data.pretrain import build_pretrain_datasets
    from data.sft import SFTDataset, build_rows
    from data.tokenizer import load_tokenizer
    from data.tools.make_tokenizer import train_bpe_tokenizer

    tok = train_bpe_tokenizer(texts=["some words to merge"] * 5, vocab_size=300, out=tmp_path / "t")
    tokenizer = load_tokenizer(tok)
    (tmp_path / "train.jsonl").write_text('{"prompt": "q", "response": "a"}\n')
    small = f"model.vocab_size={tokenizer.vocab_size - 1}"
    sft = cfg_with(
        "data.kind=sft", f"data.path={tmp_path / 'train.jsonl'}", f"data.tokenizer={tok}", small
    )
    before_launch = problems(sft, LOCAL, tmp_path)
    assert [field for field, _ in before_launch] == ["data.tokenizer"]
    with pytest.raises(ConfigError) as rows:
        build_rows(SFTDataset, sft, tokenizer, 4, "train")
    assert rows.value.problems == before_launch
    mock = cfg_with(f"data.tokenizer={tok}", small)
    with pytest.raises(ConfigError) as datasets:
        build_pretrain_datasets(mock, tokenizer, 4, 1)
    assert datasets.value.problems == problems(mock, LOCAL, tmp_path) == before_launch


def test_check_refuses_a_large_tokenizer_as_the_launcher_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`recipes check` reads data.tokenizer too (where the path is seen as given), and refuses it
    with the launcher's field and message, before anything is launched."""
    from data.tools.make_tokenizer import train_bpe_tokenizer
    from recipes.cli import main

    tok = train_bpe_tokenizer(texts=["words to merge"] * 5, vocab_size=300, out=tmp_path / "t")
    (tmp_path / "train.jsonl").write_text('{"prompt": "q", "response": "a"}\n')
    sft = ["data.kind=sft", f"data.path={tmp_path / 'train.jsonl'}", f"data.tokenizer={tok}"]
    for vocab, valid in ((64, False), (4096, True)):
        overrides = [*sft, f"model.vocab_size={vocab}"]
        code = main(["check", "tiny_gpt_pretrain", *overrides, "--json"])
        report = json.loads(capsys.readouterr().out)
        assert (code == 0) == valid and report["valid"] == valid, report["errors"]
        launcher = problems(cfg_with(*overrides), LOCAL, tmp_path)
        assert [(e["field"], e["message"]) for e in report["errors"]] == launcher


def test_the_tokenizer_check_imports_no_torch(tmp_path: Path) -> None:
    """check_inputs runs on a login node before the queue: reading the tokenizer takes no torch."""
    code = (
        "import sys; from pathlib import Path\n"
        "from data.tools.make_tokenizer import train_bpe_tokenizer\n"
        "from launchers.inputs import check_inputs\n"
        "from launchers.profile import Profile\n"
        "from tests.unit.launchers.test_inputs import cfg_with\n"
        f"out = Path({str(tmp_path)!r}) / 't.json'\n"
        "tok = train_bpe_tokenizer(texts=['a b c'] * 3, vocab_size=300, out=out)\n"
        "check_inputs(cfg_with(f'data.tokenizer={tok}'), Profile(executor='local'), Path('.'))\n"
        "print('HEAVY', [m for m in ('torch', 'megatron', 'transformers') if m in sys.modules])\n"
    )
    out = children.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("dryrun", [True, False])
def test_run_refuses_a_missing_input_before_launching(tmp_path: Path, dryrun: bool) -> None:
    cmd = [sys.executable, "-m", "recipes", "run", "tiny_gpt_pretrain", "--device", "cpu"]
    cmd += [
        "data.kind=sft",
        f"data.path={tmp_path / 'missing.jsonl'}",
        f"data.tokenizer={tmp_path}",
    ]
    cmd += [f"logging.run_dir={tmp_path / 'run'}"] + (["--dryrun"] if dryrun else [])
    out = children.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "data.path" in out.stdout + out.stderr and "missing.jsonl" in out.stdout + out.stderr
    assert not (tmp_path / "run").exists()  # nothing written, nothing launched
