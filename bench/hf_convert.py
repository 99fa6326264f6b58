"""`recipes import` / `recipes export` throughput and peak memory on Llama-3.2-1B- and 3B-shaped
random checkpoints (BF16), against copying the same files.

    .venv/bin/python bench/hf_convert.py [--shapes 1b 3b] [--workdir /tmp/hf-bench]

Each step runs in a fresh process (`/usr/bin/time`-style peak RSS from resource.getrusage of the
child), so the figures are the command's own. Goal (issue "Hugging Face checkpoints in and out"):
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


def measured(cmd: list[str]) -> tuple[float, float]:
    """(seconds, peak resident GiB) of a child process, its RSS polled every 20 ms (psutil)."""
    import psutil

    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    proc, peak = psutil.Process(child.pid), 0
    while child.poll() is None:
        try:
            peak = max(peak, proc.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.02)
    took = time.perf_counter() - t0
    if child.wait() != 0:
        raise RuntimeError(f"{cmd} failed: {child.stderr.read().decode()[-2000:]}")
    return took, peak / 2**30


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
        copy_s, _ = measured(["cp", "-r", str(work / "hf"), str(work / "copy")])
        recipes = [py, "-m", "recipes.cli"]
        imp_s, imp_rss = measured([*recipes, "import", str(work / "hf"), str(work / "imported")])
        exp_s, exp_rss = measured([*recipes, "export", str(work / "imported"), str(work / "back")])
        print(
            json.dumps(
                {
                    "shape": shape,
                    "gb": round(gb, 2),
                    "copy_gb_s": round(gb / copy_s, 2),
                    "import_gb_s": round(gb / imp_s, 2),
                    "import_peak_rss_gib": round(imp_rss, 2),
                    "export_gb_s": round(gb / exp_s, 2),
                    "export_peak_rss_gib": round(exp_rss, 2),
                }
            ),
            flush=True,
        )
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
