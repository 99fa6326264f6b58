"""A container image made on this machine without a registry, for the container jobs of tests/slurm.

What it holds: a minimal Debian root filesystem (debootstrap's minbase of the host's own release,
plus the shared libraries Python's standard modules load), and two launchers in /usr/local/bin:
`python` runs the Python of the project's environment, mounted at VENV_IN_IMAGE, and `torchrun`
is that Python's torch.distributed.run. So a job that runs `python` or `torchrun` inside it runs the
project's code from mounts, as a site's image runs it from its own layers; `mounts` lists them.

It is built once per machine (about a minute of debootstrap and 70 MB of Debian packages) into an
enroot squashfs under CACHE, named by a hash of what goes into it, and written under a temporary
name first, so an interrupted build is never taken for a finished one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Outside the user's home (no test writes there) and kept across sessions: the debootstrap is the
# slow part.
CACHE = Path(os.environ.get("RECIPES_TEST_IMAGE_CACHE", "/var/tmp/megatron-recipes-tests"))
VENV_IN_IMAGE = "/opt/venv"
MARKER = "/etc/megatron-recipes-test-image"  # a file only the image has
# What CPython's extension modules link beyond libc (ldd over lib-dynload, Debian 12's names).
LIBRARIES = (
    "libssl3",
    "libffi8",
    "libbz2-1.0",
    "liblzma5",
    "libsqlite3-0",
    "libreadline8",
    "libncursesw6",
    "libuuid1",
    "zlib1g",
    "libexpat1",
    "libnsl2",
    "libtirpc3",
)
LAUNCHERS = {
    "usr/local/bin/python": f'#!/bin/sh\nexec {VENV_IN_IMAGE}/bin/python "$@"\n',
    "usr/local/bin/torchrun": (
        f'#!/bin/sh\nexec {VENV_IN_IMAGE}/bin/python -m torch.distributed.run "$@"\n'
    ),
}
TOOLS = {"debootstrap": "debootstrap", "mksquashfs": "squashfs-tools"}


class Unavailable(Exception):
    """This machine cannot make the image (no apt, not root, no Debian mirror); says why."""


def codename() -> str:
    """The host's Debian release: the image's libraries must match the host-built Python's."""
    fields = dict(
        line.split("=", 1)
        for line in Path("/etc/os-release").read_text().splitlines()
        if "=" in line
    )
    if fields.get("ID") != "debian" or not fields.get("VERSION_CODENAME"):
        raise Unavailable(f"the host is not Debian ({fields.get('PRETTY_NAME', '?')})")
    return fields["VERSION_CODENAME"].strip('"')


def _run(argv: list[str], timeout: float) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise Unavailable(f"{' '.join(argv[:3])} ... failed: {(done.stderr or done.stdout)[-800:]}")


def install_tools() -> None:
    missing = sorted({pkg for tool, pkg in TOOLS.items() if not shutil.which(tool)})
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Unavailable(f"{', '.join(missing)} missing, and apt-get (as root) is unavailable")
    os.environ.setdefault("DEBIAN_FRONTEND", "noninteractive")
    _run(["apt-get", "update", "-qq"], timeout=600)
    _run(["apt-get", "install", "-y", "-qq", *missing], timeout=600)


def image() -> Path:
    """The squashfs, built when this machine has none of this content yet."""
    if sys.base_prefix in ("/", "/usr", "/usr/local"):
        # mounts() would cover the image's own /usr with the host's
        raise Unavailable(
            f"the venv's Python lives in {sys.base_prefix}; the image needs one apart"
        )
    if os.geteuid() != 0:
        raise Unavailable("debootstrap needs root")
    release = codename()
    recipe = repr((release, LIBRARIES, sorted(LAUNCHERS.items()), MARKER))
    path = CACHE / f"debian-{release}-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}.sqsh"
    if path.is_file():
        return path
    install_tools()
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="build-") as tmp:
        root = Path(tmp) / "root"
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(LIBRARIES)}",
                release,
                str(root),
            ],
            timeout=900,
        )
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        for rel, text in LAUNCHERS.items():
            (root / rel).write_text(text)
            (root / rel).chmod(0o755)
        (root / MARKER.lstrip("/")).write_text("made by tests/support/container_image.py\n")
        partial = Path(tmp) / "image.sqsh"
        _run(
            ["mksquashfs", str(root), str(partial), "-comp", "lzo", "-noappend", "-quiet"],
            timeout=900,
        )
        partial.rename(path)
    return path


def mounts(repo: Path) -> list[str]:
    """What a job in the image needs mounted: the project (its working directory), the virtual
    environment where the image's `python` looks for it, and the Python that environment was made
    from (a venv's interpreter is a link to it)."""
    return [
        f"{repo}:{repo}",
        f"{sys.prefix}:{VENV_IN_IMAGE}:ro",
        f"{sys.base_prefix}:{sys.base_prefix}:ro",
    ]
