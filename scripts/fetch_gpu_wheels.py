"""Download the wheels a bare GPU machine lacks into wheels/gpu/ (ignored by git), for `make gpu-check`.

The lent GPU machine has Python 3.12, torch 2.11 with CUDA 13 and a long list of common packages
(IMAGE, read off such a machine on 2026-11-17), but no Megatron-Core, Energon or torchtitan, and no
network. What it lacks travels with the working tree as wheels (64 MiB in all, the tree included):

    .venv/bin/python scripts/fetch_gpu_wheels.py [--dest wheels/gpu]

Versions are those of this checkout's .venv (the ones the CPU tests ran), except torchtitan's
stack, which the venv does not hold (TORCHTITAN). Never torch, triton or a CUDA package: the
machine's own torch must be the one that runs.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEST = REPO / "wheels" / "gpu"
BUDGET_MIB = 64.0  # what may travel to the GPU machine, working tree included

# What the engine imports on a rank (training/, models/, data/) that the image lacks.
ENGINE = ("megatron-core",)
# data.kind=energon (LLaVA): megatron-energon and what `import megatron.energon` pulls in,
# measured with the import closure of training.engine + data.energon in this venv.
ENERGON = (
    "megatron-energon",
    "multi-storage-client",
    "webdataset",
    "braceexpand",
    "bracex",
    "wcmatch",
    "filetype",
    "rapidyaml",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-semantic-conventions",
    "opentelemetry-proto",
    "opentelemetry-exporter-prometheus",
    "jsonschema",
    "jsonschema-specifications",
    "referencing",
    "rpds-py",
    "lark",
    "deprecation",
    "xattr",
    "cffi",
    "pycparser",
)
# torchtitan's Llama 3 model, loss and compile helpers (bench/torchtitan_compare.py). 0.3.0 is the
# first release whose model imports without `datasets`; it was run on torch 2.14 here, and its
# torch_checkpointing dependency (not imported by the harness) asks for torch>=2.11.
TORCHTITAN = {
    "torchtitan": "0.3.0",
    "spmd-types": "0.2.3",
    "tyro": "1.0.17",
    "docstring-parser": "0.18.0",
    "typeguard": "4.6.0",
}
# The lent machine's image (the device README's list, 2026-11-17): never carried.
IMAGE = frozenset(
    """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
    hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
    jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
    linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl
    meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
    narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
    nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-
    curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-
    cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
    opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
    packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
    propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
    pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
    python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-
    build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
    setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate
    tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
    tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision
    tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
    wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
    """.split()
)
FORBIDDEN = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*|transformer-engine.*)$")
PLATFORM_FLAGS = [
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    *[
        f"--platform={p}"
        for p in (
            "manylinux_2_28_x86_64",
            "manylinux_2_27_x86_64",
            "manylinux_2_24_x86_64",
            "manylinux_2_17_x86_64",
            "manylinux2014_x86_64",
            "manylinux1_x86_64",
            "manylinux_2_5_x86_64",
        )
    ],
]


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def plan(version_of: Callable[[str], str | None] = installed_version) -> list[str]:
    """The pinned requirements to download: ENGINE and ENERGON at this venv's versions, then
    TORCHTITAN. Raises when a name has no version here, is in the image, or is torch/CUDA."""
    pins: dict[str, str] = {}
    for name in (*ENGINE, *ENERGON):
        version = version_of(name)
        if version is None:
            raise SystemExit(f"{name} is not installed in this venv: run `make env` first")
        pins[normalize(name)] = version
    pins |= {normalize(n): v for n, v in TORCHTITAN.items()}
    bad = [n for n in pins if FORBIDDEN.match(n) or n in IMAGE]
    if bad:
        raise SystemExit(f"never carried (the image has them, or they are torch/CUDA): {bad}")
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def wheel_problems(files: list[Path], wanted: list[str]) -> list[str]:
    """What is wrong with a downloaded set: a wheel for another Python or platform, two versions
    of one package, a requirement with no wheel, a forbidden package."""
    problems, seen = [], {}
    for f in files:
        parts = f.name[: -len(".whl")].split("-")
        if len(parts) < 5:
            problems.append(f"{f.name}: not a wheel name")
            continue
        name, version, py, _, plat = normalize(parts[0]), parts[1], parts[-3], parts[-2], parts[-1]
        if name in seen:
            problems.append(f"{name}: two versions ({seen[name]}, {version})")
        seen[name] = version
        if FORBIDDEN.match(name):
            problems.append(f"{f.name}: torch/CUDA must never be carried")
        if plat != "any" and "x86_64" not in plat:
            problems.append(f"{f.name}: not for x86_64 Linux")
        if not any(tag in py for tag in ("py3", "cp312")):
            problems.append(f"{f.name}: not for Python 3.12")
    for req in wanted:
        name, version = req.split("==")
        if seen.get(name) != version:
            problems.append(f"{req}: no wheel downloaded")
    return problems


def size_mib(files: list[Path]) -> float:
    return sum(f.stat().st_size for f in files) / 2**20


def tree_mib() -> float:
    """What else travels: tracked and untracked, not ignored, files of this checkout."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    paths = [REPO / p for p in out.decode().split("\0") if p]
    return sum(p.stat().st_size for p in paths if p.is_file()) / 2**20


def download(requirements: list[str], dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    wanted = {tuple(r.split("==")) for r in requirements}
    for old in dest.glob("*.whl"):  # one version of each: a stale one would stop the install
        name, version = old.name.split("-")[:2]
        if (normalize(name), version) not in wanted:
            old.unlink()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest)]
    subprocess.run([*cmd, *PLATFORM_FLAGS, *requirements], check=True)
    return sorted(dest.glob("*.whl"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=DEST)
    parser.add_argument("--dry-run", action="store_true", help="print the plan only")
    args = parser.parse_args(argv)
    requirements = plan()
    if args.dry_run:
        print("\n".join(requirements))
        return 0
    files = download(requirements, args.dest)
    problems = wheel_problems(files, requirements)
    wheels, tree = size_mib(files), tree_mib()
    print(f"{len(files)} wheels, {wheels:.1f} MiB in {args.dest}; working tree {tree:.1f} MiB")
    if wheels + tree > BUDGET_MIB:
        problems.append(f"wheels + tree = {wheels + tree:.1f} MiB > {BUDGET_MIB} MiB")
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
