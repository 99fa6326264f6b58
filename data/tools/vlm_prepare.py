"""Image-caption pairs -> WebDataset shards -> an Energon dataset (for data.kind=energon).

    recipes data prepare SRC OUT [--on-error skip|stop] [--shard-size 1000] [--split 1,0,0]

SRC is a folder of images, each with a caption in a same-name .txt next to it (`cat.jpg` +
`cat.txt`, searched recursively), or a JSONL file of {"image": path, "text": caption} lines (image
paths relative to the file). Every image is decoded once with PIL before it is written, so a
corrupt file is caught here and not in the middle of a training run.

Nothing is dropped silently: every file that is not written is reported with its name and the
reason (corrupt image, missing caption, caption without image, empty caption, bad JSONL line,
a file that is neither image nor caption), counted in the summary and listed in
OUT/prepare_report.json. `--on-error stop` stops at the first bad sample and removes the shards it
wrote; `skip` (the default) leaves the bad sample out and goes on.

The shards are then prepared by Energon's own `energon prepare` command, run non-interactively in
this process: the tar index, the split (train/val/test by ratio) and a dataset.yaml that maps the
shard parts onto Energon's CaptioningSample (image: jpg or png, caption: txt).
"""

from __future__ import annotations

import contextlib
import io
import json
import tarfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
FIELD_MAP = {"image": "jpg,png", "caption": "txt"}  # Energon's CaptioningSample <- shard parts
REPORT = "prepare_report.json"


class PrepareError(Exception):
    """A sample that stops the preparation (--on-error stop), or an unusable SRC/OUT."""


@dataclass(frozen=True, slots=True)
class Problem:
    file: str  # the file (or "file:line") that was not written
    reason: str


@dataclass(slots=True)
class PrepareReport:
    source: str
    output: str
    written: int = 0
    shards: int = 0
    skipped: list[Problem] = field(default_factory=list)  # bad samples, left out
    ignored: list[Problem] = field(default_factory=list)  # files that are no sample at all

    def summary(self) -> str:
        lines = [
            f"prepared {self.written} samples in {self.shards} shard(s) under {self.output}; "
            f"skipped {len(self.skipped)} bad sample(s), ignored {len(self.ignored)} other file(s)"
        ]
        lines += [f"  skipped {p.file}: {p.reason}" for p in self.skipped]
        lines += [f"  ignored {p.file}: {p.reason}" for p in self.ignored]
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class _Candidate:
    name: str  # how the sample is reported: path relative to SRC, or "file.jsonl:line"
    image: Path | None
    caption: str | None
    problem: str | None = None  # known bad before the image is even opened


def _folder_candidates(src: Path, ignored: list[Problem]) -> Iterator[_Candidate]:
    files = sorted(p for p in src.rglob("*") if p.is_file())
    images: dict[Path, Path] = {}
    captions: set[Path] = set()
    for path in files:
        stem = path.with_suffix("")
        if path.suffix.lower() in IMAGE_SUFFIXES:
            if stem in images:
                yield _Candidate(
                    str(path.relative_to(src)),
                    path,
                    None,
                    f"a second image for the caption {stem.name}.txt (first: {images[stem].name})",
                )
                continue
            images[stem] = path
        elif path.suffix == ".txt":
            captions.add(stem)
        elif path.name != REPORT:
            ignored.append(
                Problem(str(path.relative_to(src)), "neither an image nor a .txt caption")
            )
    for stem in sorted(captions - images.keys()):
        yield _Candidate(
            str(stem.relative_to(src)) + ".txt", None, None, "caption without an image"
        )
    for stem, image in sorted(images.items()):
        name = str(image.relative_to(src))
        if stem not in captions:
            yield _Candidate(name, image, None, f"missing caption {stem.name}.txt")
            continue
        yield _Candidate(name, image, stem.with_suffix(".txt").read_text(encoding="utf-8"))


def _jsonl_candidates(src: Path) -> Iterator[_Candidate]:
    with src.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            name = f"{src.name}:{number}"
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                yield _Candidate(name, None, None, f"invalid JSON ({err.msg})")
                continue
            if not isinstance(row, dict) or "image" not in row or "text" not in row:
                yield _Candidate(name, None, None, 'needs {"image": path, "text": caption}')
                continue
            image = (src.parent / str(row["image"])).resolve()
            if not image.is_file():
                yield _Candidate(f"{name} ({row['image']})", None, None, "missing image file")
                continue
            yield _Candidate(f"{name} ({row['image']})", image, str(row["text"]))


def _encode_image(path: Path) -> tuple[str, bytes]:
    """(shard part, bytes) after a full decode; JPEG and PNG keep their bytes, others become PNG."""
    from PIL import Image

    data = path.read_bytes()
    with Image.open(io.BytesIO(data)) as image:
        image.load()  # decodes every pixel: truncated or corrupt files raise here
        if image.format == "JPEG":
            return "jpg", data
        if image.format == "PNG":
            return "png", data
        out = io.BytesIO()
        image.convert("RGB").save(out, format="PNG")
        return "png", out.getvalue()


class _ShardWriter:
    """Plain tar shards of `size` samples each: KEY.jpg|png, KEY.txt, KEY.json (source name)."""

    def __init__(self, out: Path, size: int) -> None:
        self.out, self.size, self.count = out, size, 0
        self.paths: list[Path] = []
        self._tar: tarfile.TarFile | None = None

    def add(self, parts: dict[str, bytes]) -> None:
        if self.count % self.size == 0:
            self.close()
            self.paths.append(self.out / f"shard-{len(self.paths):06d}.tar")
            self._tar = tarfile.open(self.paths[-1], "w")
        key = f"{self.count:09d}"  # no dots: WebDataset splits a member name at its first dot
        for ext, data in parts.items():
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size, info.mode = len(data), 0o644
            self._tar.addfile(info, io.BytesIO(data))
        self.count += 1

    def close(self) -> None:
        if self._tar is not None:
            self._tar.close()
            self._tar = None

    def remove(self) -> None:
        self.close()
        for path in self.paths:
            path.unlink(missing_ok=True)


def run_energon_prepare(out: Path, split: str = "1,0,0") -> None:
    """`energon prepare OUT --non-interactive ...`, Energon's own CLI, in this process."""
    from megatron.energon.tools.prepare import command

    args = [
        str(out),
        "--non-interactive",
        "--force-overwrite",
        "--no-progress",
        "--split-ratio",
        split,
        "--num-workers",
        "2",
        "--sample-type",
        "CaptioningSample",
        "--field-map",
        json.dumps(FIELD_MAP),
    ]
    log = io.StringIO()  # Energon prints samples and a progress dialogue; shown only on failure
    try:
        with contextlib.redirect_stdout(log):
            command.main(args, prog_name="energon prepare", standalone_mode=False)
    except Exception as err:  # click.ClickException and Energon's own errors
        raise PrepareError(f"energon prepare {out} failed: {err}\n{log.getvalue()}") from err


def prepare_captions(
    src: str | Path,
    out: str | Path,
    *,
    on_error: str = "skip",
    shard_size: int = 1000,
    split: str = "1,0,0",
    log: bool = True,
) -> PrepareReport:
    """Write SRC's image-caption pairs as shards under OUT and prepare them for Energon."""
    if on_error not in ("skip", "stop"):
        raise ValueError(f"on_error must be 'skip' or 'stop', not {on_error!r}")
    src, out = Path(src), Path(out)
    if not src.exists():
        raise PrepareError(f"{src} does not exist; give a folder of images + .txt or a .jsonl file")
    if src.is_file() and src.suffix != ".jsonl":
        raise PrepareError(f'{src} is a file but not a .jsonl of {{"image", "text"}} lines')
    if any(out.glob("*.tar")):
        raise PrepareError(f"{out} already holds .tar shards; choose an empty output folder")
    out.mkdir(parents=True, exist_ok=True)
    report = PrepareReport(source=str(src), output=str(out))
    candidates = (
        _jsonl_candidates(src) if src.is_file() else _folder_candidates(src, report.ignored)
    )
    writer = _ShardWriter(out, shard_size)
    try:
        for c in candidates:
            problem, parts = c.problem, None
            if problem is None and not (c.caption or "").strip():
                problem = "empty caption"
            if problem is None:
                try:
                    ext, data = _encode_image(c.image)
                except Exception as err:  # PIL raises OSError, ValueError, SyntaxError, ...
                    problem = f"corrupt image ({type(err).__name__}: {err})"
                else:
                    source = json.dumps({"source": c.name}).encode()
                    parts = {ext: data, "txt": c.caption.strip().encode(), "json": source}
            if problem is not None:
                if on_error == "stop":
                    raise PrepareError(
                        f"{c.name}: {problem} (--on-error stop; nothing was prepared)"
                    )
                report.skipped.append(Problem(c.name, problem))
                if log:
                    print(f"skipping {c.name}: {problem}", flush=True)
                continue
            writer.add(parts)
    except BaseException:
        writer.remove()
        raise
    writer.close()
    report.written, report.shards = writer.count, len(writer.paths)
    (out / REPORT).write_text(json.dumps(asdict(report), indent=2), encoding="utf-8")
    if report.written == 0:
        raise PrepareError(f"no usable sample in {src}:\n{report.summary()}")
    run_energon_prepare(out, split)
    return report
