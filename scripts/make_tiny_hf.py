"""Write a tiny random Hugging Face model folder, to try the Hugging Face path on a laptop CPU.

    .venv/bin/python scripts/make_tiny_hf.py OUT_DIR [--family llama|qwen3|qwen3_moe|mixtral|deepseek_v3]
        [--tokenizer runs/synthetic_sft/tokenizer.json | runs/synthetic_chat/tokenizer]

The shapes are those of the catalog's tiny models (4 layers, hidden 128, 4 heads in 2 KV groups,
vocabulary 512), made by transformers from its config classes with random weights and saved with
`save_pretrained`, as a downloaded model folder looks (nothing is fetched from a hub). With
--tokenizer, that tokenizer.json (or the files of a tokenizer folder, such as the one `recipes data
make-synthetic-chat --tokenizer DIR` writes with a chat template) goes into the folder too, as a
model's own tokenizer would.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

COMMON = dict(
    vocab_size=512,
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
)


def config(family: str):  # noqa: ANN201  (a transformers config object)
    import transformers

    if family == "llama":
        return transformers.LlamaConfig(intermediate_size=512, **COMMON)
    if family == "qwen3":
        return transformers.Qwen3Config(intermediate_size=512, head_dim=32, **COMMON)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(
            intermediate_size=512,
            moe_intermediate_size=128,
            num_experts=4,
            num_experts_per_tok=2,
            head_dim=32,
            norm_topk_prob=True,
            **COMMON,
        )
    if family == "mixtral":
        return transformers.MixtralConfig(
            intermediate_size=128, num_local_experts=4, num_experts_per_tok=2, **COMMON
        )
    if family == "deepseek_v3":
        return transformers.DeepseekV3Config(
            intermediate_size=512,
            moe_intermediate_size=128,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            first_k_dense_replace=1,
            n_shared_experts=1,
            q_lora_rank=64,
            kv_lora_rank=32,
            qk_nope_head_dim=32,
            qk_rope_head_dim=16,
            v_head_dim=32,
            **{**COMMON, "num_key_value_heads": 4},
        )
    raise SystemExit(f"unknown family {family!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument(
        "--family",
        default="llama",
        choices=["llama", "qwen3", "qwen3_moe", "mixtral", "deepseek_v3"],
    )
    parser.add_argument(
        "--tokenizer",
        help="a tokenizer.json, or a tokenizer folder (its files, chat template included), to "
        "put into the folder",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    import torch
    import transformers

    torch.manual_seed(args.seed)
    model = transformers.AutoModelForCausalLM.from_config(config(args.family))
    out = Path(args.out_dir)
    model.save_pretrained(out)
    tokenizer = Path(args.tokenizer) if args.tokenizer else None
    if tokenizer is not None and tokenizer.is_dir():  # a model folder carries its tokenizer's files
        for item in tokenizer.iterdir():
            if item.is_file():
                shutil.copyfile(item, out / item.name)
    elif tokenizer is not None:
        shutil.copyfile(tokenizer, out / "tokenizer.json")
        settings = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}
        (out / "tokenizer_config.json").write_text(json.dumps(settings) + "\n")
    print(f"wrote {out} ({sum(p.numel() for p in model.parameters()):,} parameters)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
