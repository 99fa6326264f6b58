"""`make gpu-check` on the CPU: the wheel plan, the install into a folder over this machine's torch,
torchtitan's harness on a tiny shape, and the comparison logic of the GPU benchmarks.

The install tests need wheels/gpu (scripts/fetch_gpu_wheels.py, a download) and skip without it.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.support import children

REPO = Path(__file__).resolve().parents[3]
WHEELS = REPO / "wheels" / "gpu"
# Last on the path: the bench scripts' modules are found without shadowing any other module.
sys.path += [str(REPO / "bench"), str(REPO / "scripts")]

import fetch_gpu_wheels as fetch  # noqa: E402
import gpu_async_save  # noqa: E402
import gpu_attention  # noqa: E402
import gpu_check  # noqa: E402
import gpu_memory  # noqa: E402
import perf_one_gpu  # noqa: E402

# --- the wheel plan ---------------------------------------------------------------------------


def test_plan_pins_this_venvs_versions_and_torchtitans_stack() -> None:
    pins = fetch.plan(lambda name: "1.2.3")
    assert "megatron-core==1.2.3" in pins and "megatron-energon==1.2.3" in pins
    assert "torchtitan==0.3.0" in pins and "spmd-types==0.2.3" in pins
    names = [p.split("==")[0] for p in pins]
    assert len(names) == len(set(names)), "one version of each package"
    assert not [n for n in names if fetch.FORBIDDEN.match(n) or n in fetch.IMAGE]


def test_plan_refuses_a_package_missing_here() -> None:
    with pytest.raises(SystemExit, match="megatron-core is not installed"):
        fetch.plan(lambda name: None if name == "megatron-core" else "1.0")


def test_plan_never_carries_torch_or_what_the_image_has(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "ENGINE", ("megatron-core", "torch"))
    with pytest.raises(SystemExit, match="torch"):
        fetch.plan(lambda name: "1.0")
    monkeypatch.setattr(fetch, "ENGINE", ("megatron-core", "PyYAML"))
    with pytest.raises(SystemExit, match="pyyaml"):
        fetch.plan(lambda name: "1.0")


def test_wheel_problems_name_each_fault() -> None:
    wanted = ["megatron-core==0.19.2", "lark==1.3.1"]
    files = [
        Path("megatron_core-0.19.2-cp312-cp312-manylinux_2_28_x86_64.whl"),
        Path("megatron_core-0.19.1-cp312-cp312-manylinux_2_28_x86_64.whl"),
        Path("rpds_py-1.0-cp311-cp311-manylinux_2_17_x86_64.whl"),
        Path("xattr-1.0-cp312-cp312-macosx_11_0_arm64.whl"),
        Path("torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl"),
    ]
    problems = "\n".join(fetch.wheel_problems(files, wanted))
    assert "megatron-core: two versions" in problems
    assert "rpds_py-1.0-cp311" in problems and "not for Python 3.12" in problems
    assert "not for x86_64 Linux" in problems
    assert "torch/CUDA must never be carried" in problems
    assert "lark==1.3.1: no wheel downloaded" in problems
    good = [Path("lark-1.3.1-py3-none-any.whl"), files[0]]
    assert fetch.wheel_problems(good, wanted) == []


# --- the install into a folder, over this machine's torch -------------------------------------


def _image_like(folder: Path) -> Path:
    """This venv's packages that the lent machine's image holds too (fetch.IMAGE), linked into
    one folder: with `python -S`, that folder + the carried wheels' is what the machine has."""
    site = Path(sysconfig.get_paths()["purelib"])
    folder.mkdir()
    for dist in importlib.metadata.distributions():
        if fetch.normalize(dist.metadata["Name"]) not in fetch.IMAGE:
            continue
        for top in {Path(str(f)).parts[0] for f in dist.files or ()}:
            if top.startswith("..") or top == "__pycache__":
                continue
            source, link = site / top, folder / top
            if source.exists() and not link.exists():
                link.symlink_to(source)
    return folder


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """wheels/gpu installed as scripts/gpu_check.sh installs it (no index, no dependencies)."""
    if not list(WHEELS.glob("*.whl")):
        pytest.skip("no wheels/gpu: run scripts/fetch_gpu_wheels.py (a download) first")
    folder = tmp_path_factory.mktemp("site")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    cmd += ["--no-compile", "--target", str(folder), *map(str, WHEELS.glob("*.whl"))]
    children.run(cmd, check=True, capture_output=True)
    return folder


def _bare_python(target: Path, image: Path, code: str) -> subprocess.CompletedProcess:
    prelude = f"import sys; sys.path[:0] = {[str(target), str(image), str(REPO)]!r}\n"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return children.run(
        [sys.executable, "-S", "-c", prelude + code],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
    )


def test_the_engine_imports_from_the_carried_wheels_over_the_image(
    target: Path, tmp_path: Path
) -> None:
    """Only the image's packages and the carried wheels: every module a GPU rank, the LLaVA data
    path and the torchtitan harness import must come from them, torch from the image."""
    image = _image_like(tmp_path / "image")
    code = """
import torch, megatron.core, megatron.energon, torchtitan
import training.engine, training.entry, training.checkpoint.store, data.energon, data.sft
import models.llava, torchtitan.models.llama3, torchtitan.components.loss
print(torch.__file__); print(megatron.core.__file__); print(megatron.energon.__file__)
print(torchtitan.__file__)
"""
    proc = _bare_python(target, image, code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    torch_file, *carried = proc.stdout.split()[-4:]
    assert torch_file.startswith(str(image)), torch_file
    assert all(path.startswith(str(target)) for path in carried), carried


def test_torchtitan_trains_its_llama3_on_a_tiny_shape_on_the_cpu(
    target: Path, tmp_path: Path
) -> None:
    out = tmp_path / "titan.json"
    cmd = [sys.executable, str(REPO / "bench" / "torchtitan_compare.py"), "--device", "cpu"]
    cmd += ["--flavor", "debugmodel", "--layers", "2", "--seq", "32", "--steps", "2"]
    cmd += ["--warmup", "1", "--microbatches", "2", "--attn", "sdpa", "--json", str(out)]
    env = dict(os.environ, PYTHONPATH=str(target), OMP_NUM_THREADS="1")
    proc = children.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["torchtitan"] == fetch.TORCHTITAN["torchtitan"]
    assert result["layers"] == 2 and result["shape"]["dim"] == 256
    assert len(result["losses"]) == 2 and all(0 < loss < 20 for loss in result["losses"])
    assert result["tokens_per_s"] == pytest.approx(32 * 2 / result["step_time_s"])
    # The 8B flavor is the proxy's shape (checked from the config, nothing built).
    check = (
        "from torchtitan_compare import PROXY, config_shape\n"
        "from torchtitan.models.llama3 import llama3_configs\n"
        "assert config_shape(llama3_configs['8B'](attn_backend='flex')) == PROXY\n"
    )
    env["PYTHONPATH"] += os.pathsep + str(REPO / "bench")
    proc = children.run([sys.executable, "-c", check], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]


# --- the comparison logic of the GPU benchmarks ------------------------------------------------


def test_every_memory_shape_is_a_valid_one_gpu_config_that_fits_an_h100(tmp_path: Path) -> None:
    assert {"dense", "dense_recompute", "moe_ep1", "sft_packed", "llava"} <= {
        s.name for s in gpu_memory.SHAPES
    }
    for shape in gpu_memory.SHAPES:
        cfg = gpu_memory.config_for(shape, tmp_path / shape.name, tmp_path / "data", "cuda")
        prediction = gpu_memory.predict(cfg, "h100")
        assert prediction["problems"] == [], (shape.name, prediction["problems"])
        assert 5 < prediction["predicted_gib"] < 0.9 * 80, (shape.name, prediction)
    recompute = {s.name: s for s in gpu_memory.SHAPES}
    dense, full = (
        gpu_memory.predict(gpu_memory.config_for(recompute[n], tmp_path, tmp_path, "cuda"), "h100")
        for n in ("dense", "dense_recompute")
    )
    assert full["predicted_parts_gib"]["activations"] < dense["predicted_parts_gib"]["activations"]


def test_the_proxy_takes_the_layers_check_would_let_it_run(tmp_path: Path) -> None:
    """As many layers as `recipes check` judges to fit (MEMORY_MARGIN free), not the whole GPU:
    26 layers, predicted 136.7 of an H200's 139.8 GiB, ran out of memory there."""
    import gpu_llama3_8b_proxy as proxy

    from config.cost.memory import MEMORY_MARGIN

    for gpu, fit in (("h100", 10), ("h200", 23)):
        assert proxy.layers_that_fit(gpu, "bf16_mixed") == fit
        cluster = proxy.Cluster(num_nodes=1, gpus_per_node=1, gpu=gpu)
        for layers, fits in ((fit, True), (fit + 1, False)):
            overrides = proxy.proxy_overrides(layers, 15, "bf16_mixed", tmp_path)
            cfg = proxy.apply_overrides(proxy.get("llama3_8b_pretrain").config(), overrides)
            total = proxy.estimate_memory(cfg, cluster, proxy.derive(cfg, cluster)).total_gib
            assert (total <= cluster.spec.memory_gib * (1 - MEMORY_MARGIN)) is fits


def test_torchtitan_imports_without_a_name_torch_2_11_lacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torchtitan 0.3.0's FSDP helper imports DataParallelMeshDims (torch >= 2.12); the lent
    machine's torch is 2.11, where the harness puts a placeholder of that name."""
    import torch.distributed.fsdp as fsdp
    from torchtitan_compare import allow_torch_2_11

    if hasattr(fsdp, "DataParallelMeshDims"):
        monkeypatch.delattr(fsdp, "DataParallelMeshDims")
    allow_torch_2_11()
    assert isinstance(fsdp.DataParallelMeshDims, type)
    kept = fsdp.DataParallelMeshDims
    allow_torch_2_11()  # torch's own (or the first placeholder) is kept
    assert fsdp.DataParallelMeshDims is kept


def test_memory_comparison_ratios_and_goal() -> None:
    measured = {"peak_allocated_gib": 9.5, "peak_reserved_gib": 12.5, "device_used_gib": 13.0}
    close = gpu_memory.compare(10.0, measured)
    assert close["ratio_to_allocated"] == pytest.approx(10 / 9.5)
    assert close["ratio_to_reserved"] == pytest.approx(0.8)
    assert close["ratio_to_device_used"] == pytest.approx(10 / 13)
    assert close["within_goal"] is True
    far = gpu_memory.compare(10.0, {"peak_allocated_gib": 8.0, "peak_reserved_gib": 9.0})
    assert far["within_goal"] is False
    cpu = gpu_memory.compare(10.0, {"peak_allocated_gib": None, "peak_reserved_gib": None})
    assert cpu["ratio_to_allocated"] is None and cpu["within_goal"] is None


def test_memory_runs_every_shape_with_a_fake_measurement(tmp_path: Path) -> None:
    seen: list[Path] = []

    def measure(config: Path, probe: Path, timeout: float) -> dict:
        seen.append(config)
        return {"peak_allocated_gib": 20.0, "peak_reserved_gib": 22.0, "exit_code": 0}

    shapes = [s for s in gpu_memory.SHAPES if s.data is None]
    results = gpu_memory.run_shapes(shapes, tmp_path, device="cuda", gpu="h100", measure=measure)
    assert [c.name for c in seen] == [f"{s.name}.yaml" for s in shapes]
    for shape in shapes:
        r = results[shape.name]
        assert r["ratio_to_allocated"] == pytest.approx(r["predicted_gib"] / 20.0)
        assert "overhead" in r["predicted_parts_gib"]
    late = gpu_memory.run_shapes(
        shapes, tmp_path, device="cuda", gpu="h100", measure=measure, deadline=0.0
    )
    assert all(r == {"skipped": "no time left in this run"} for r in late.values())


def test_async_save_overhead_and_attention_share_arithmetic() -> None:
    plain = [0.0, 1.0, 2.0, 3.0, 4.0]  # 1 s per step
    saving = [0.0, 1.0, 2.5, 3.5, 5.0]  # two saves of 0.5 s
    figures = gpu_async_save.overhead(plain, saving, 2)
    assert figures["overhead_s_per_save"] == pytest.approx(0.5)
    assert figures["overhead_share_of_step"] == pytest.approx(0.5)
    shares = gpu_attention.shares({"sdpa": 0.01, "local": 0.03}, 1.0, layers=5, micro=4)
    assert shares["sdpa_share_of_step"] == pytest.approx(0.2)
    assert shares["step_s_with_local_estimated"] == pytest.approx(1.4)
    assert shares["local_share_of_step"] == pytest.approx(0.6 / 1.4)
    assert gpu_attention.shares({"sdpa": 0.01, "local": 0.03}, None, 5, 4) == {}


# --- the orchestrator --------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z")


def test_a_step_records_its_result_its_failure_or_that_it_had_no_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gpu_check, "MIN_S", 1.0)
    monkeypatch.setattr(gpu_check, "GRACE_S", 1.0)
    write = "import json,sys; json.dump(dict(x=1), open(sys.argv[1], 'w'))"
    ok = gpu_check.Step("ok", 30, [sys.executable, "-c", write, "{out}/result.json"], [])
    record = gpu_check.run_step(ok, False, tmp_path, {}, deadline=1e12)
    assert record["status"] == "ok" and record["result"] == {"x": 1}
    # Over budget: the step ends with the processes it started (as torchrun's ranks), even one
    # that ignores the SIGINT the step gets first.
    stubborn = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(120)"
    spawn = (
        "import subprocess, sys, time; "
        f"child = subprocess.Popen([sys.executable, '-c', {stubborn!r}]); "
        "open(sys.argv[1], 'w').write(str(child.pid)); time.sleep(120)"
    )
    slow = gpu_check.Step("slow", 3, [sys.executable, "-c", spawn, "{out}/child.pid"], [])
    record = gpu_check.run_step(slow, False, tmp_path, {}, deadline=1e12)
    assert record["status"] == "failed: over its 3 s budget"
    import time

    child = int((tmp_path / "slow" / "child.pid").read_text())
    for _ in range(50):  # killed: gone, or a zombie where nothing reaps orphans
        if not _alive(child):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the step's child {child} outlived its budget")
    late = gpu_check.run_step(ok, False, tmp_path, {}, deadline=time.monotonic() + 1.5)
    assert late["status"].startswith("not run:") and "seconds" not in late
    fails = gpu_check.Step("fails", 30, [sys.executable, "-c", "raise SystemExit(3)"], [])
    assert gpu_check.run_step(fails, False, tmp_path, {}, 1e12)["status"] == "failed: exit 3"


def test_headline_ratios_from_the_steps() -> None:
    figures = {
        "proxy": {"result": {"bf16_mixed": {"tokens_per_s": 1150.0, "mfu": 0.55}}},
        "torchtitan_eager": {"result": {"tokens_per_s": 1000.0}},
        "memory": {"result": {"dense": {"ratio_to_allocated": 1.05}, "llava": {"error": "x"}}},
        "async_save": {"result": {"overhead_s_per_save": 0.2, "resume_exact": True}},
    }
    h = gpu_check.headline(figures)
    assert h["ours_over_torchtitan_eager"] == pytest.approx(1.15)
    assert h["ours_over_torchtitan_compile"] is None
    assert h["proxy_mfu"] == 0.55 and h["resume_exact"] is True
    assert h["memory_predicted_over_measured"] == {"dense": 1.05, "llava": None}
    # The attention step takes the proxy's step time from the proxy step's result.
    figures["proxy"]["result"]["bf16_mixed"]["step_time_s"] = 2.5
    attention = next(s for s in gpu_check.STEPS if s.name == "attention")
    assert "2.5" in gpu_check.command(attention, False, Path("/x"), figures)


def _proxy_step_at(gemm_bf16: float, layers: int = 6) -> tuple[float, float]:
    """The step time config/cost/steptime.py predicts for the BF16 proxy at another GEMM rate, and its
    attention time per layer and microbatch."""
    from config.cost import steptime as perf
    from config.hardware import Cluster
    from config.rules import derive

    cfg, h100 = perf_one_gpu.proxy_config(layers, "bf16_mixed"), Cluster(1, 1, "h100")
    k = {**perf.VALUES, "gemm_bf16": gemm_bf16}
    step = perf.predict(cfg, h100, derive(cfg, h100), k)
    return step.seconds, perf.layer_costs(cfg, h100, derive(cfg, h100), k).dense["attention"]


def test_the_one_gpu_fit_finds_the_rates_a_measurement_implies() -> None:
    from config.cost import steptime as perf

    measured, attention = _proxy_step_at(0.55)
    fit = perf_one_gpu.fit("h100", "bf16_mixed", 6, measured)
    assert fit["gemm_constant"] == "gemm_bf16" and fit["gemm_fit"] == pytest.approx(0.55, abs=1e-6)
    assert fit["predicted_over_measured"] < 1  # the table's 0.70 predicts a shorter step
    # SDPA measured 25% slower than the model's attention: the attention rate falls by as much,
    # and the GEMM rate that explains the same step rises to make up for it.
    fit = perf_one_gpu.fit("h100", "bf16_mixed", 6, measured, sdpa_fwd_bwd_s=attention * 1.25)
    assert fit["attention_fit"] == pytest.approx(perf.VALUES["attention"] / 1.25)
    assert fit["gemm_fit"] > 0.56
    # A step no GEMM rate explains (faster than the model's other terms alone): no fit, a reason.
    fit = perf_one_gpu.fit("h100", "bf16_mixed", 6, measured / 20)
    assert fit["gemm_fit"] is None and "no gemm_bf16" in fit["gemm_fit_note"]


def test_the_calibrate_step_fits_what_the_proxy_and_attention_steps_wrote(tmp_path: Path) -> None:
    measured, attention = _proxy_step_at(0.6)
    for step, result in (
        ("proxy", {"bf16_mixed": {"device": "NVIDIA H100 80GB HBM3", "layers": 6}}),
        ("attention", {"sdpa_fwd_bwd_s": attention}),
        ("env", {"transformer-engine": None}),
    ):
        (tmp_path / step).mkdir()
        (tmp_path / step / "result.json").write_text(json.dumps(result))
    proxy = json.loads((tmp_path / "proxy" / "result.json").read_text())
    proxy["bf16_mixed"]["step_time_s"] = measured
    (tmp_path / "proxy" / "result.json").write_text(json.dumps(proxy))
    calibrate = next(s for s in gpu_check.STEPS if s.name == "calibrate")
    (tmp_path / "calibrate").mkdir()
    cmd = gpu_check.command(calibrate, False, tmp_path / "calibrate", {})
    assert perf_one_gpu.main(cmd[2:]) == 0  # what the step runs, in this process
    fits = json.loads((tmp_path / "calibrate" / "result.json").read_text())
    assert fits[0]["gemm_fit"] == pytest.approx(0.6, abs=1e-6)
    assert fits[0]["transformer_engine"] is None  # the fit is then a lower bound: no TE fusions
    headline = gpu_check.headline({"calibrate": {"result": fits}})
    assert headline["gemm_fit"] == {"gemm_bf16": pytest.approx(0.6, abs=1e-6)}
    table = _proxy_step_at(perf_one_gpu.perf.VALUES["gemm_bf16"])[0]
    assert headline["model_predicted_over_measured"] == pytest.approx(table / measured)
    # On the CPU dry run the proxy's figures are the CPU's: nothing to fit, and it says so.
    proxy["bf16_mixed"]["device"] = "cpu"
    (tmp_path / "proxy" / "result.json").write_text(json.dumps(proxy))
    perf_one_gpu.main(cmd[2:])
    assert "skipped" in json.loads((tmp_path / "calibrate" / "result.json").read_text())[0]


def test_the_logs_tarball_leaves_checkpoints_and_data_behind() -> None:
    import tarfile

    def info(name: str, size: int = 10) -> tarfile.TarInfo:
        member = tarfile.TarInfo(name)
        member.size = size
        return member

    kept = ["g/memory/dense.probe.json", "g/proxy/log.txt", "g/a/run/metrics.jsonl"]
    dropped = ["g/a/resume/checkpoints/iter_0000004/x.distcp", "g/memory/data_vlm_cuda/a.tar"]
    dropped += ["g/proxy/huge.log"]
    assert all(gpu_check.small_files(info(n)) is not None for n in kept)
    sizes = {"g/proxy/huge.log": 5 * 2**20}
    assert all(gpu_check.small_files(info(n, sizes.get(n, 10))) is None for n in dropped)


def test_junit_summary_lists_skips_with_reasons(tmp_path: Path) -> None:
    xml = tmp_path / "junit.xml"
    xml.write_text(
        '<testsuites><testsuite><testcase classname="t" name="a"/>'
        '<testcase classname="t" name="b"><skipped message="needs 2 GPUs"/></testcase>'
        '<testcase classname="t" name="c"><failure message="boom"/></testcase>'
        '<testcase time="0.000" />'  # what pytest writes for a test a SIGINT cut
        "</testsuite></testsuites>"
    )
    summary = gpu_check.junit_summary(xml)
    assert summary["passed"] == ["t::a"] and summary["failed"] == ["t::c"]
    assert summary["skip_reasons"] == {"t::b": "needs 2 GPUs"}


# --- the torch floor ---------------------------------------------------------------------------


def test_the_torch_floor_is_one_line_that_the_container_check_enforces() -> None:
    """pyproject.toml states the floor once; containers/check_base.py (the Dockerfile's check)
    refuses an older NGC torch build by that line, and the GPU machines' 2.11 passes."""
    sys.path.append(str(REPO / "containers"))
    import check_base

    pyproject = REPO / "pyproject.toml"
    floor = check_base.torch_requirement(pyproject)
    assert str(floor.specifier) == ">=2.11"
    assert check_base.problem((3, 12), "2.11.0+cu130", pyproject) is None
    assert check_base.problem((3, 12), "2.11.0a0+ebd3f52", pyproject) is None  # NGC's tag
    refused = check_base.problem((3, 12), "2.10.0a0+5228986", pyproject)
    assert refused is not None and "torch>=2.11" in refused and "2.10.0a0" in refused
    assert "3.12" in (check_base.problem((3, 11), "2.14.1", pyproject) or "")
    dockerfile = (REPO / "containers" / "Dockerfile").read_text()
    assert "check_base.py pyproject.toml" in dockerfile and "COPY config config" in dockerfile
    assert "check_base.py pyproject.toml" in (REPO / "containers" / "recipes.def").read_text()
    assert "2.1" not in dockerfile.split("ARG BASE_IMAGE")[0], "the floor is stated in one place"
    # The environment the tests run in meets it too.
    import torch
    from packaging.version import Version

    assert floor.specifier.contains(Version(Version(torch.__version__).base_version))


def test_the_summary_names_the_command_for_the_steps_the_deadline_cut() -> None:
    steps = {
        "proxy": {"status": "ok", "seconds": 40.0, "command": "python proxy"},
        "memory": {"status": "not run: 12 s left of the run's deadline", "command": "m"},
        "pytest": {"status": "not run: 0 s left of the run's deadline", "command": "p"},
    }
    text = gpu_check.summary({"date": "d", "device": "H100", "headline": {}, "steps": steps})
    assert '--only memory,pytest" make gpu-check' in text
    assert "| proxy | ok | 40.0 | `python proxy` |" in text
