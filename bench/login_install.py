"""The login-node install (requirements-login.txt, then `pip install --no-deps .`), measured against
the full install, on this machine (x86_64) and, by resolution from PyPI, on aarch64 (JUPITER's
login nodes).

    .venv/bin/python bench/login_install.py [--repeat 5] [--skip-aarch64]

1. A fresh venv with the login install from PyPI, as a user types it (this machine's pip
   configuration, which adds local mirrors and caps, is left out; no cache): wall time, size on
   disk, packages; then `recipes check`, `plan` and `run --dryrun` for JUPITER from that venv, timed.
2. The full install beside it: what `pip install .` put into this interpreter's venv (the project's
   base dependencies and what they pull in, extras left out), and torch with its CUDA wheels alone.
3. aarch64: the login set downloaded as aarch64 wheels (`pip download --platform ...`: it fails if
   one has neither an aarch64 nor a pure-Python wheel) plus the project's own wheel (pure Python);
   then the wheels pip would take for the same torch on aarch64 and on x86_64 (resolved with
   `pip install --dry-run --report`, sizes from PyPI's index pages: nothing large is downloaded).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
LOGIN = REPO / "requirements-login.txt"
# Wheels for glibc 2.17 to 2.34 (pip takes no lower manylinux tag by itself with --platform).
GLIBC = range(17, 35)
PLATFORMS = {
    arch: [f"manylinux_2_{v}_{arch}" for v in GLIBC] + [f"manylinux2014_{arch}"]
    for arch in ("aarch64", "x86_64")
}
COMMANDS = [
    "check llama3_8b_pretrain --profile jupiter",
    "plan llama3_70b_pretrain --profile jupiter --nodes 16",
    "run llama3_8b_pretrain --profile jupiter --nodes 2 --dryrun",
]
MB = 1e6


def pypi_env() -> dict[str, str]:
    """pip as on a login node: PyPI only (this machine's pip.conf adds local mirrors and a cap on
    torch), no cache, no version check."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k == "PIP_CERT"}
    return env | {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_CACHE_DIR": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


def pip(python: Path | str, *args: str, cwd: Path = REPO) -> None:
    subprocess.run([str(python), "-m", "pip", *args], check=True, cwd=cwd, env=pypi_env())


def size(path: Path) -> int:
    """Bytes of the files under path (apparent size, links not followed)."""
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def light_install(venv: Path) -> dict[str, float]:
    """The README's commands for a login node, timed from an empty folder to a working venv."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip(python, "install", "--quiet", "-r", str(LOGIN))
    pip(python, "install", "--quiet", "--no-deps", ".")
    seconds = time.perf_counter() - start
    site = next((venv / "lib").glob("python3*/site-packages"))
    packages = len(list(site.glob("*.dist-info")))
    return {
        "seconds": seconds,
        "venv": size(venv),
        "site": size(site),
        "pip": size(site / "pip"),  # the venv's own pip, there before any install
        "packages": packages,
    }


def time_commands(venv: Path, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as cwd:
        for command in COMMANDS:
            times, codes = [], set()
            for _ in range(repeat):
                start = time.perf_counter()
                done = subprocess.run(
                    [str(venv / "bin" / "recipes"), *command.split()], capture_output=True, cwd=cwd
                )
                times.append(time.perf_counter() - start)
                codes.add(done.returncode)
            print(
                f"  recipes {command:<58} exit {sorted(codes)}  median "
                f"{statistics.median(times):.2f} s  best {min(times):.2f} s"
            )


def closure(names: list[str]) -> list[md.Distribution]:
    """The installed distributions that `names` pull in (markers evaluated, extras left out)."""
    todo, seen, out = list(names), set(), []
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        out.append(dist)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return out


def installed(dist: md.Distribution) -> int:
    return sum(
        p.stat().st_size for f in dist.files or [] if (p := Path(dist.locate_file(f))).is_file()
    )


def full_install() -> None:
    """What `pip install .` installed here: the project's base dependencies, recursively."""
    dists = closure(["megatron-recipes"])
    sizes = {d.metadata["Name"]: installed(d) for d in dists}
    cuda = {n: s for n, s in sizes.items() if re.match(r"(torch|triton|nvidia|cuda)", n, re.I)}
    print(
        f"full install (this venv, {platform.machine()}): {len(sizes)} packages, "
        f"{sum(sizes.values()) / MB:,.0f} MB installed; torch {md.version('torch')} with "
        f"triton, nvidia-* and cuda-* ({len(cuda)} packages): {sum(cuda.values()) / MB:,.0f} MB"
    )


def aarch64_login(folder: Path) -> None:
    """Download the login set as aarch64 wheels and build the project's wheel."""
    platforms = [a for p in PLATFORMS["aarch64"] for a in ("--platform", p)]
    pip(
        sys.executable,
        *("download", "--quiet", "--only-binary=:all:", *platforms, "--python-version", "3.12"),
        *("--implementation", "cp", "-r", str(LOGIN), "-d", str(folder)),
    )
    pip(sys.executable, "wheel", "--quiet", "--no-deps", ".", "-w", str(folder))
    wheels = sorted(folder.glob("*.whl"))
    print(f"login install on aarch64: {len(wheels)} wheels, {size(folder) / MB:.2f} MB download")
    for wheel in wheels:
        print(f"  {wheel.name}  {wheel.stat().st_size / MB:.2f} MB")
    own = [w for w in wheels if w.name.startswith("megatron_recipes-")]
    assert own and own[0].name.endswith("-py3-none-any.whl"), own


def resolve(requirement: str, arch: str, folder: Path) -> list[tuple[str, str]]:
    """The wheels pip would take for `requirement` on `arch` (Python 3.12): (name, file name)."""
    report = folder / f"report-{arch}.json"
    platforms = [a for p in PLATFORMS[arch] for a in ("--platform", p)]
    pip(
        sys.executable,
        *("install", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report)),
        *("--only-binary=:all:", *platforms, "--python-version", "3.12", "--implementation", "cp"),
        *("--target", str(folder / "unused"), requirement),
    )
    items = json.loads(report.read_text())["install"]
    return [(i["metadata"]["name"], i["download_info"]["url"].rsplit("/", 1)[1]) for i in items]


def wheel_size(name: str, filename: str) -> int:
    """A file's size from PyPI's JSON index page of its project (PEP 691/700), as pip reads it."""
    request = urllib.request.Request(
        f"https://pypi.org/simple/{name}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=60) as page:
        files = json.load(page)["files"]
    return next(f["size"] for f in files if f["filename"] == filename)


def torch_wheels(folder: Path) -> None:
    version = md.version("torch").split("+")[0]
    for arch in ("aarch64", "x86_64"):
        wheels = [(n, f, wheel_size(n, f)) for n, f in resolve(f"torch=={version}", arch, folder)]
        torch = next(s for n, _, s in wheels if n == "torch")
        total = sum(s for *_, s in wheels)
        print(
            f"torch {version} on {arch} from PyPI: the torch wheel {torch / MB:,.0f} MB; with its "
            f"{len(wheels) - 1} dependencies {total / MB:,.0f} MB download"
        )
        for _, filename, bytes_ in sorted(wheels, key=lambda w: -w[2])[:4]:
            print(f"  {filename}  {bytes_ / MB:,.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each command (median)")
    parser.add_argument("--skip-aarch64", action="store_true", help="only this machine's install")
    args = parser.parse_args()
    print(f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="login-install-") as tmp:
        light = light_install(Path(tmp) / "venv")
        print(
            f"login install: {light['seconds']:.1f} s (venv, then pip install -r "
            f"{LOGIN.name} and pip install --no-deps .), {light['packages']:.0f} packages with pip "
            f"and the project, "
            f"{light['venv'] / MB:.1f} MB venv ({light['site'] / MB:.1f} MB site-packages, "
            f"{light['pip'] / MB:.1f} MB of it pip)"
        )
        time_commands(Path(tmp) / "venv", args.repeat)
        full_install()
        if not args.skip_aarch64:
            aarch64_login(Path(tmp) / "aarch64")
            torch_wheels(Path(tmp))


if __name__ == "__main__":
    main()
