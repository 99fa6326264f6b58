"""The stand-in `apptainer` of the script tests (tests/support/fake_apptainer.py): it refuses what
Apptainer 1.5 refuses, so that a script test can fail, and accepts and runs Apptainer's real forms.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import children, fake_apptainer


def apptainer(
    tmp: Path, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`apptainer argv...` through the shim the script tests put on PATH, in `tmp`, where src/
    is a folder and img.sif an image; {src}, {img} in `argv` name them."""
    src, img = tmp / "src", tmp / "img.sif"
    src.mkdir(exist_ok=True)
    fake_apptainer.write_sif(img)
    args = [a.replace("{src}", str(src)).replace("{img}", str(img)) for a in argv]
    command = ["bash", "-c", fake_apptainer.SHIM, "apptainer", *args]
    environ = {"PATH": os.environ["PATH"]} | (env or {})
    return children.run(command, env=environ, cwd=tmp, capture_output=True, text=True, timeout=60)


# fmt: off
REFUSED = [  # argv, Apptainer's exit status (1: the command line, 255: the start), what it says
    (["exce", "{img}", "true"], 1, 'unknown command "exce"'),
    (["exec", "--bnd", "{src}", "{img}", "true"], 1, "unknown flag: --bnd"),
    (["exec", "--shell", "/bin/sh", "{img}", "true"], 1, "unknown flag: --shell"),  # shell's
    (["exec", "-x", "{img}", "true"], 1, "unknown shorthand flag: 'x' in -x"),
    (["exec", "--bind"], 1, "flag needs an argument: --bind"),
    (["exec", "-B"], 1, "flag needs an argument: 'B' in -B"),
    (["exec", "--nv=yes", "{img}", "true"], 1, "invalid argument 'yes' for --nv"),
    (["exec", "--pids-limit", "many", "{img}", "true"], 1, "invalid argument 'many'"),
    (["exec", "--env", "A=1,B", "{img}", "true"], 1, "B must be formatted as key=value"),
    (["exec", "--nv", "{img}"], 1, "requires at least 2 arg(s), only received 1"),
    (["exec", "--nv"], 1, "only received 0"),
    (["exec", "--bind", "{src}:/a:rbind", "{img}", "true"], 255, "rbind is not a valid bind"),
    (["exec", "--bind", "{src}:/a:ro:x", "{img}", "true"], 255, "bad bind syntax"),
    (["exec", "--bind", "{src}:data", "{img}", "true"], 255, "must be an absolute path"),
    (["exec", "--bind", ":/a", "{img}", "true"], 255, "empty bind source"),
    (["exec", "--bind", "{src}/gone:/a", "{img}", "true"], 255, "gone doesn't exist"),
    (["exec", "--pwd", "data", "{img}", "true"], 255, "'data' is not an absolute path"),
    (["exec", "-B", "{src}:/data", "--pwd", "/data/gone", "{img}", "true"], 255,
     "failed to set working directory"),
    (["exec", "{src}/gone.sif", "true"], 255, "could not open image"),
    (["exec", "{src}/empty.sif", "true"], 255, "image format not recognized"),  # a name only
    (["exec", "dokker://nvcr.io/nvidia/pytorch:25.04-py3", "true"], 255, "Unsupported transport"),
    (["exec", "{img}", "no-such-command"], 255, "no-such-command"),
    (["run", "{img}"], 255, "runs only `exec`"),
]
# fmt: on


@pytest.mark.parametrize(("argv", "status", "said"), REFUSED, ids=lambda v: str(v)[:40])
def test_the_stand_in_refuses_what_apptainer_refuses(
    argv: list[str], status: int, said: str, tmp_path: Path
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src/empty.sif").touch()
    done = apptainer(tmp_path, *argv)
    assert (done.returncode, done.stdout) == (status, ""), done.stderr
    assert said in done.stderr


def test_the_forms_our_launcher_renders_run_the_command_with_the_containers_variables(
    tmp_path: Path,
) -> None:
    shown = 'pwd; echo "$X $Y ${APPTAINERENV_X-taken} ${LD_LIBRARY_PATH-dropped}"'
    env = {"APPTAINERENV_X": "x", "SINGULARITYENV_Y": "y", "LD_LIBRARY_PATH": "/host/lib"}
    binds = "{src}:{src},{src}:/data:ro"
    argv = ["exec", "--nv", "--no-home", "--bind", binds, "--pwd", "/data", "{img}", "sh", "-c"]
    done = apptainer(tmp_path, *argv, shown, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{tmp_path / 'src'}\nx y taken dropped\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["-q", "exec", "-B{src}:/data:ro,rw", "--env=X=flag", "-ec", "--cwd=/data", "--", "{img}"],
        ["--debug", "exec", "--nv=false", "-B", "{src}:/data", "--env", "X=flag", "{img}"],
    ],
)
def test_short_attached_and_global_forms_are_accepted(argv: list[str], tmp_path: Path) -> None:
    done = apptainer(tmp_path, *argv, "sh", "-c", 'echo "$X"', env={"APPTAINERENV_X": "prefix"})
    assert (done.returncode, done.stdout) == (0, "flag\n"), done.stderr  # --env wins


def test_sandbox_squashfs_and_registry_images_are_images(tmp_path: Path) -> None:
    (tmp_path / "sandbox/opt").mkdir(parents=True)
    (tmp_path / "img.sqsh").write_bytes(b"hsqs" + bytes(92))
    sandbox = apptainer(tmp_path, "exec", "--pwd", "/opt", str(tmp_path / "sandbox"), "pwd")
    assert (sandbox.returncode, sandbox.stdout) == (0, f"{tmp_path}/sandbox/opt\n"), sandbox.stderr
    for image in ("img.sqsh", "docker://nvcr.io/nvidia/pytorch:25.04-py3", "oras://r/i:1"):
        done = apptainer(tmp_path, "exec", image, "echo", "ran")
        assert (done.returncode, done.stdout) == (0, "ran\n"), done.stderr
