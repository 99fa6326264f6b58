"""containers/README.md, the image path for offline sites, as far as this machine can check it
(no Docker daemon, enroot or Apptainer here): every file of containers/ is described, every file
its commands build from exists, the Dockerfile's base is multi-arch NGC PyTorch, and the image
locations the site profiles name are where its commands put the images."""

from __future__ import annotations

import re
from pathlib import Path

from launchers.profile import load_profile, shipped_profiles

REPO = Path(__file__).resolve().parents[3]
DOC = (REPO / "containers" / "README.md").read_text(encoding="utf-8")


def commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", DOC, re.S)
    return [line for b in blocks for line in re.sub(r"\\\n\s*", " ", b).splitlines() if line]


def test_every_file_of_containers_is_described() -> None:
    files = {p.name for p in (REPO / "containers").iterdir() if p.is_file()} - {"README.md"}
    described = set(re.findall(r"^\| `([^`]+)` \|", DOC, re.M))
    assert files == described


def test_the_files_the_commands_build_from_exist() -> None:
    named = [w for line in commands() for w in line.split() if w.startswith("containers/")]
    assert named and all((REPO / w).is_file() for w in named), named


def test_the_base_is_an_ngc_pytorch_release() -> None:
    dockerfile = (REPO / "containers" / "Dockerfile").read_text(encoding="utf-8")
    base = re.search(r"^ARG BASE_IMAGE=(\S+)", dockerfile, re.M)
    assert base and re.fullmatch(r"nvcr\.io/nvidia/pytorch:\d\d\.\d\d-py3", base.group(1))


def test_the_site_profiles_images_are_the_formats_the_commands_make() -> None:
    """GH200 sites get the arm64 image; Apptainer sites a .sif, pyxis and EDF sites a .sqsh."""
    made = {
        w for line in commands() for w in re.findall(r"megatron-recipes[\w-]*\.(?:sif|sqsh)", line)
    }
    for name in shipped_profiles():
        profile = load_profile(name)
        image = Path(profile.container_image or "").name
        if not image:
            continue
        assert image in made or not image.startswith("megatron-recipes"), (name, image)
        if profile.gpu and profile.gpu.startswith("gh200"):
            assert "arm64" in image, (name, image)
        suffix = ".sif" if profile.executor == "slurm-apptainer" else ".sqsh"
        assert image.endswith(suffix), (name, image)
