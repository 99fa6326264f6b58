"""`recipes import` / `recipes export` throughput and peak memory on Llama-3.2-1B- and 3B-shaped
random checkpoints (BF16), against copying the same files.

    .venv/bin/python bench/hf_convert.py [--shapes 1b 3b] [--workdir /tmp/hf-bench]

Each step runs in a fresh process whose resident memory is polled (psutil, /proc): peak RSS, and
peak anonymous RSS, which leaves out the pages of the safetensors files the reader maps (page
cache, not the process's own). Goal:
peak memory that does not grow with the model (the 3B's peak exceeds the 1B's by less than its
largest tensor) and throughput within 2x of copying the files.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAPES = {  # meta-llama/Llama-3.2-1B and -3B config.json, vocabulary 128,256, tied embeddings
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, heads=32, kv=8),
    "3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, heads=24, kv=8),
}

MAKE = """
import json, sys, torch
from pathlib import Path
from safetensors.torch import save_file
shape = json.loads(sys.argv[2]); out = Path(sys.argv[1]); out.mkdir(parents=True)
h, f, n, heads, kv = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"], shape["heads"], shape["kv"]
d = h // heads
g = torch.Generator().manual_seed(0)
def r(*s): return torch.randn(*s, generator=g, dtype=torch.float32).to(torch.bfloat16)
index, shard, size, k = {}, {}, 0, 0
def flush():
    global shard, size, k
    if shard:
        k += 1; name = f"model-{k:05d}.safetensors"; save_file(shard, out / name, {"format": "pt"})
        index.update({t: name for t in shard}); shard, size = {}, 0
def add(name, t):
    global size
    shard[name] = t; size += t.numel() * 2
    if size > 2**30: flush()
add("model.embed_tokens.weight", r(128256, h))
for i in range(n):
    p = f"model.layers.{i}"
    for name, t in (("input_layernorm.weight", r(h)), ("post_attention_layernorm.weight", r(h)),
        ("self_attn.q_proj.weight", r(heads * d, h)), ("self_attn.k_proj.weight", r(kv * d, h)),
        ("self_attn.v_proj.weight", r(kv * d, h)), ("self_attn.o_proj.weight", r(h, heads * d)),
        ("mlp.gate_proj.weight", r(f, h)), ("mlp.up_proj.weight", r(f, h)), ("mlp.down_proj.weight", r(h, f))):
        add(f"{p}.{name}", t)
add("model.norm.weight", r(h)); flush()
(out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
(out / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": h, "intermediate_size": f, "num_hidden_layers": n, "num_attention_heads": heads,
    "num_key_value_heads": kv, "head_dim": d, "vocab_size": 128256, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "tie_word_embeddings": True, "max_position_embeddings": 131072,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, "hidden_act": "silu"}))
"""


def _anon_bytes(pid: int) -> int:
    """Anonymous resident memory (RssAnon): what the process itself holds, without the pages of
    files it maps (safetensors are read through mmap; those pages are the page cache's)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def measured(cmd: list[str]) -> tuple[float, float, float]:
    """(seconds, peak RSS GiB, peak anonymous RSS GiB) of a child, polled every 20 ms (psutil)."""
    import psutil

    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    proc, peak, anon = psutil.Process(child.pid), 0, 0
    while child.poll() is None:
        try:
            peak = max(peak, proc.memory_info().rss)
            anon = max(anon, _anon_bytes(child.pid))
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.02)
    took = time.perf_counter() - t0
    if child.wait() != 0:
        raise RuntimeError(f"{cmd} failed: {child.stderr.read().decode()[-2000:]}")
    return took, peak / 2**30, anon / 2**30


COPY = """
import sys
from pathlib import Path
src, dst = Path(sys.argv[1]), Path(sys.argv[2]); dst.mkdir()
for f in src.iterdir():
    with open(f, "rb") as a, open(dst / f.name, "wb") as b:
        while chunk := a.read(64 << 20):
            b.write(chunk)
"""


def size_gb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["1b"], choices=list(SHAPES))
    parser.add_argument("--workdir", default="/tmp/hf-bench")
    args = parser.parse_args()
    py = sys.executable
    for shape in args.shapes:
        work = Path(args.workdir) / shape
        shutil.rmtree(work, ignore_errors=True)
        subprocess.run([py, "-c", MAKE, str(work / "hf"), json.dumps(SHAPES[shape])], check=True)
        gb = size_gb(work / "hf")
        # cp clones on file systems that can (reflinks, copy_file_range); the byte copy reads and
        # writes every byte as a conversion must.
        cp_s, _, _ = measured(["cp", "-r", str(work / "hf"), str(work / "cp")])
        copy_s, _, _ = measured([py, "-c", COPY, str(work / "hf"), str(work / "copy")])
        recipes = [py, "-m", "recipes.cli"]
        imp = measured([*recipes, "import", str(work / "hf"), str(work / "imported")])
        exp = measured([*recipes, "export", str(work / "imported"), str(work / "back")])
        print(
            json.dumps(
                {
                    "shape": shape,
                    "gb": round(gb, 2),
                    "cp_gb_s": round(gb / cp_s, 2),
                    "byte_copy_gb_s": round(gb / copy_s, 2),
                    "import_gb_s": round(gb / imp[0], 2),
                    "import_peak_rss_gib": round(imp[1], 2),
                    "import_peak_anon_gib": round(imp[2], 2),
                    "export_gb_s": round(gb / exp[0], 2),
                    "export_peak_rss_gib": round(exp[1], 2),
                    "export_peak_anon_gib": round(exp[2], 2),
                }
            ),
            flush=True,
        )
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
