"""The machine gpu-check ran on: GPU, driver, torch and the carried packages (bench/gpu_check.py).

python bench/gpu_check_env.py OUT.json
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

PACKAGES = ("torch", "megatron-core", "megatron-energon", "torchtitan", "transformer-engine")
MODULES = ("megatron.core", "megatron.energon", "torchtitan.models.llama3")


def describe() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"python": sys.version.split()[0], "cuda": torch.version.cuda}
    for name in PACKAGES:
        try:
            info[name] = version(name)
        except PackageNotFoundError:
            info[name] = None
    info["imports"], info["import_errors"] = {}, {}
    sys.path.insert(0, str(Path(__file__).parent))
    from torchtitan_compare import allow_torch_2_11

    allow_torch_2_11()  # as the harness imports torchtitan
    for module in MODULES:  # from the carried wheels' folder, on top of the machine's torch
        try:
            info["imports"][module] = importlib.import_module(module).__file__
        except Exception as err:  # noqa: BLE001 - what failed is the figure
            info["import_errors"][module] = f"{type(err).__name__}: {err}"
    info["torch_file"] = torch.__file__
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info |= {
            "device": torch.cuda.get_device_name(),
            "capability": list(torch.cuda.get_device_capability()),
            "memory_gib": props.total_memory / 2**30,
            "gpus": torch.cuda.device_count(),
        }
        smi = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        try:
            info["driver"] = subprocess.run(smi, capture_output=True, text=True).stdout.strip()
        except OSError:
            info["driver"] = None
    else:
        info["device"] = "cpu"
    return info


if __name__ == "__main__":
    result = describe()
    print(json.dumps(result, indent=1))
    Path(sys.argv[1]).write_text(json.dumps(result, indent=1))
    sys.exit(1 if result["import_errors"] else 0)
