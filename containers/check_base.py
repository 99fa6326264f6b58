"""The base image check of containers/Dockerfile: Python 3.12 and torch at pyproject.toml's floor.

    python containers/check_base.py pyproject.toml PINS.txt

Exits with a message naming both versions when the image's Python or torch is too old (NGC tags
its torch build "2.x.0a0+<commit>": the release, 2.x.0, is what is compared), otherwise writes the
image's own torch and Transformer Engine pins to PINS.txt, so that installing the other
dependencies never replaces NGC's CUDA build of torch with a PyPI wheel.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version


def torch_requirement(pyproject: Path) -> Requirement:
    with pyproject.open("rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    return next(r for r in map(Requirement, dependencies) if r.name == "torch")


def problem(python: tuple[int, int], torch_version: str, pyproject: Path) -> str | None:
    """Why this base image cannot hold the recipes, or None."""
    if python != (3, 12):
        return f"this image has Python {python[0]}.{python[1]}; the recipes need 3.12"
    wanted = torch_requirement(pyproject).specifier
    have = Version(torch_version)
    if not wanted.contains(Version(have.base_version), prereleases=True):
        return (
            f"the base image has torch {have}; pyproject.toml needs torch{wanted}: "
            "pick a newer BASE_IMAGE"
        )
    return None


def pins() -> list[str]:
    """The image's torch and Transformer Engine, as pip constraints."""
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    keep = ("torch==", "transformer-engine", "transformer_engine")
    return [line for line in frozen if line.lower().startswith(keep)]


def main(argv: list[str]) -> int:
    import torch

    pyproject, out = Path(argv[0]), Path(argv[1])
    why = problem(sys.version_info[:2], torch.__version__, pyproject)
    if why:
        print(why, file=sys.stderr)
        return 1
    kept = pins()
    out.write_text("\n".join(kept) + "\n")
    print("keeping the image's", ", ".join(kept))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
