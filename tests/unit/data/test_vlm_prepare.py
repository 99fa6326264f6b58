"""`recipes data prepare`: image-caption folders and JSONL -> Energon datasets, nothing dropped silently."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from PIL import Image

from data.tools.vlm_prepare import PrepareError, prepare_captions
from recipes.cli import main as recipes_main


def _image(path: Path, color: tuple[int, int, int] = (200, 30, 30), size=(40, 30)) -> None:
    Image.new("RGB", size, color).save(path)


def _jpeg_bytes() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 64), (10, 120, 200)).save(out, format="JPEG")
    return out.getvalue()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """6 good pairs (one nested, one BMP) and one of each kind of problem."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for i in range(4):
        _image(src / f"ok{i}.jpg", (50 * i, 100, 100))
        (src / f"ok{i}.txt").write_text(f"a picture number {i}\n")
    _image(src / "sub" / "nested.png")
    (src / "sub" / "nested.txt").write_text("a nested picture")
    _image(src / "other.bmp")
    (src / "other.txt").write_text("a bitmap")
    (src / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not a jpeg")
    (src / "broken.txt").write_text("never seen")
    (src / "truncated.jpg").write_bytes(_jpeg_bytes()[:300])
    (src / "truncated.txt").write_text("cut short")
    _image(src / "nocaption.png")
    (src / "orphan.txt").write_text("a caption without its image")
    _image(src / "blank.jpg")
    (src / "blank.txt").write_text("   \n")
    (src / "notes.md").write_text("not part of the dataset")
    return src


def _shard_sources(out: Path) -> list[str]:
    sources = []
    for shard in sorted(out.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".json"):
                    sources.append(json.loads(tar.extractfile(member).read())["source"])
    return sources


def test_skip_reports_every_bad_file_and_writes_the_rest(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    report = prepare_captions(folder, out, on_error="skip", shard_size=4, log=False)
    skipped = {p.file: p.reason for p in report.skipped}
    assert set(skipped) == {
        "broken.jpg",
        "truncated.jpg",
        "nocaption.png",
        "orphan.txt",
        "blank.jpg",
    }
    assert skipped["broken.jpg"].startswith("corrupt image")
    assert skipped["truncated.jpg"].startswith("corrupt image")
    assert skipped["nocaption.png"] == "missing caption nocaption.txt"
    assert skipped["orphan.txt"] == "caption without an image"
    assert skipped["blank.jpg"] == "empty caption"
    assert [p.file for p in report.ignored] == ["notes.md"]
    # Nothing silently dropped: every image or caption is written or reported.
    written = _shard_sources(out)
    assert report.written == len(written) == 6 and report.shards == 2
    assert sorted(written) == sorted(
        ["ok0.jpg", "ok1.jpg", "ok2.jpg", "ok3.jpg", "sub/nested.png", "other.bmp"]
    )
    stems = {p.with_suffix("").relative_to(folder) for p in folder.rglob("*") if p.is_file()}
    accounted = {Path(n).with_suffix("") for n in [*written, *skipped, "notes.md"]}
    assert stems == accounted
    saved = json.loads((out / "prepare_report.json").read_text())
    assert saved["written"] == 6 and len(saved["skipped"]) == 5
    assert "skipped 5 bad sample(s)" in report.summary()


def test_prepared_folder_is_an_energon_captioning_dataset(folder: Path, tmp_path: Path) -> None:
    from megatron.energon import CaptioningSample, WorkerConfig, get_loader, get_train_dataset

    out = tmp_path / "out"
    prepare_captions(folder, out, log=False)
    assert (out / ".nv-meta" / "dataset.yaml").is_file()
    dataset = get_train_dataset(
        out,
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        batch_size=None,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
        repeat=False,
    )
    samples = list(get_loader(dataset))
    assert len(samples) == 6 and all(isinstance(s, CaptioningSample) for s in samples)
    assert {s.caption for s in samples} >= {"a picture number 0", "a nested picture", "a bitmap"}
    assert all(s.image.shape[0] == 3 for s in samples)


def test_stop_names_the_file_and_leaves_no_shards(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(PrepareError, match=r"orphan\.txt: caption without an image"):
        prepare_captions(folder, out, on_error="stop", shard_size=2, log=False)
    assert not list(out.glob("*.tar"))


def test_stop_on_a_corrupt_image(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    _image(src / "a.png")
    (src / "a.txt").write_text("fine")
    (src / "b.jpg").write_bytes(b"garbage")
    (src / "b.txt").write_text("broken")
    with pytest.raises(PrepareError, match=r"b\.jpg: corrupt image"):
        prepare_captions(src, tmp_path / "out", on_error="stop", log=False)


def test_jsonl_source(tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    _image(images / "one.png")
    _image(images / "two.jpg")
    (images / "bad.jpg").write_bytes(b"nope")
    lines = [
        {"image": "images/one.png", "text": "first"},
        "{not json",
        {"image": "images/two.jpg"},
        {"image": "images/missing.png", "text": "gone"},
        {"image": "images/bad.jpg", "text": "corrupt"},
        {"image": "images/two.jpg", "text": "second"},
    ]
    src = tmp_path / "pairs.jsonl"
    src.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    report = prepare_captions(src, tmp_path / "out", log=False)
    assert report.written == 2
    reasons = {p.file.split(" ")[0]: p.reason for p in report.skipped}
    assert reasons["pairs.jsonl:2"].startswith("invalid JSON")
    assert reasons["pairs.jsonl:3"] == 'needs {"image": path, "text": caption}'
    assert reasons["pairs.jsonl:4"] == "missing image file"
    assert reasons["pairs.jsonl:5"].startswith("corrupt image")


def test_cli_exit_codes_and_report(folder: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "stop"
    assert recipes_main(["data", "prepare", str(folder), str(out), "--on-error", "stop"]) == 2
    assert "orphan.txt" in capsys.readouterr().err
    out = tmp_path / "skip"
    assert recipes_main(["data", "prepare", str(folder), str(out), "--shard-size", "3"]) == 0
    printed = capsys.readouterr().out
    assert "prepared 6 samples in 2 shard(s)" in printed
    assert "skipped truncated.jpg: corrupt image" in printed
    assert "ignored notes.md" in printed
    # An output folder that already holds shards is refused rather than mixed.
    assert recipes_main(["data", "prepare", str(folder), str(out)]) == 2


def test_make_synthetic_vlm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "synthetic"
    assert recipes_main(["data", "make-synthetic-vlm", str(out), "--samples", "20"]) == 0
    # The hint it prints is a complete data section: following it must work.
    hint = capsys.readouterr().out.strip().splitlines()[-1]
    assert hint == f"use data.kind=energon data.path={out} data.tokenizer={out / 'tokenizer.json'}"
    assert (out / "tokenizer.json").is_file() and (out / ".nv-meta" / "dataset.yaml").is_file()
    assert len(_shard_sources(out)) == 20


def test_data_path_may_be_a_weighted_blend(tmp_path: Path) -> None:
    """data.path = an Energon metadataset YAML blending prepared folders by weight."""
    from collections import Counter

    from data.energon import build_loader
    from data.tools.synthetic_vlm import make_synthetic_vlm
    from recipes.registry import get

    for name, seed in (("a", 1), ("b", 2)):
        make_synthetic_vlm(tmp_path / name, samples=32, seed=seed, log=False)
    blend = tmp_path / "blend.yaml"
    blend.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        "      - weight: 1\n        path: a\n      - weight: 3\n        path: b\n"
    )
    cfg = get("tiny_llava_pretrain").config()
    cfg.data.path, cfg.data.tokenizer = str(blend), str(tmp_path / "a" / "tokenizer.json")
    batches = iter(build_loader(cfg, 0, 1, num_workers=0))
    seen = Counter()
    for _ in range(100):
        seen.update(source.dataset_path.name for source in next(batches).__sources__)
    assert seen["b"] / (seen["a"] + seen["b"]) == pytest.approx(0.75, abs=0.08)
