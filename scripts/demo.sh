#!/usr/bin/env bash
# `make demo`: the main job. Shows and checks a few catalog recipes, then trains tiny_gpt_pretrain
# on this CPU with 2 processes and TP=2.
set -euo pipefail
recipes=.venv/bin/recipes
export NEMORUN_HOME=${NEMORUN_HOME:-$PWD/.nemo_run} MPLCONFIGDIR=${MPLCONFIGDIR:-$PWD/.mplconfig}

echo "== the catalog"
$recipes list
echo
echo "== llama3_70b_pretrain on its published cluster"
$recipes check llama3_70b_pretrain
echo
echo "== a mistake caught before the queue: FP8 on an A100"
$recipes check llama3_8b_pretrain --gpu a100 precision=bf16_with_fp8_current_scaling_mixed || echo "(exit $?)"
echo
echo "== training tiny_gpt_pretrain on this CPU: 2 processes, TP=2"
$recipes run tiny_gpt_pretrain --executor local --device cpu --gpus-per-node 2 \
    parallel.tensor_model_parallel_size=2 "$@"
