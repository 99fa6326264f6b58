#!/usr/bin/env bash
# `make gpu-check`: the GPU tests and benchmarks on a bare lent GPU, in one command.
#
# On the lent machine (the device tool: the working tree travels, ignored paths only when carried):
#   run(command="make gpu-check", carry=["wheels/gpu"], timeout_s=600)
# Before, here: .venv/bin/python scripts/fetch_gpu_wheels.py   (wheels/gpu/, about 15 MiB)
#
# The carried wheels are installed with --no-deps into a folder put first on PYTHONPATH, so the
# machine's own torch (and everything else in its image) is the one that runs; nothing is fetched.
# Figures and logs go to $OUT (the folder the device tool sends back), else ./gpu_check_out.
#   GPU_CHECK_ARGS="--only proxy,torchtitan_eager"   one or more steps (bench/gpu_check.py)
#   GPU_CHECK_ARGS="--cpu-dry-run"                   the plumbing on the CPU, tiny shapes
#   PYTHON=.venv/bin/python                          another interpreter (default: python3)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-$PWD/gpu_check_out}
WHEELS=${GPU_WHEELS:-wheels/gpu}
if [[ -z "${GPU_CHECK_SITE:-}" ]]; then
    SITE=$(mktemp -d /tmp/gpu-check-site.XXXXXX)
    trap 'rm -rf "$SITE"' EXIT
else
    SITE=$GPU_CHECK_SITE
fi
mkdir -p "$OUT"

main() {
    local start status=0
    start=$(date +%s)
    if ! ls "$WHEELS"/*.whl > /dev/null 2>&1; then
        echo "gpu-check: no wheels in $WHEELS: run scripts/fetch_gpu_wheels.py here, then carry $WHEELS"
        return 2
    fi
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$WHEELS"/*.whl || return 2
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    export PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}
    # Tests and runs write their caches to temporary folders (tests/conftest.py does the same).
    export HF_HUB_OFFLINE=1 WANDB_MODE=offline MPLCONFIGDIR=${MPLCONFIGDIR:-$SITE/.mpl}
    echo "gpu-check: wheels installed into $SITE in $(( $(date +%s) - start )) s"
    # shellcheck disable=SC2086  # GPU_CHECK_ARGS is a list of words
    "$PYTHON" bench/gpu_check.py --out "$OUT" ${GPU_CHECK_ARGS:-} || status=$?
    echo "gpu-check: done in $(( $(date +%s) - start )) s, figures in $OUT/gpu_check.json"
    return $status
}

# Everything printed also lands in $OUT/console.log (it comes back with the figures).
main 2>&1 | tee "$OUT/console.log"
exit "${PIPESTATUS[0]}"
