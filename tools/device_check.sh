#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one script for a lent device machine (about 10 minutes on
# one H100 / H200): the CUDA tests, the GPU benchmark (overhead and kernel-level accuracy, the
# compiled hooks on CUDA) and the checkpoint benchmark with the allocator's figures. Each
# report goes to $OUT (default device_out/); the performance page takes gpu.md through
# `tools/bench_page.py --only gpu` on that machine, and checkpoint_cuda.md goes into the
# closing note beside the CPU figures.
#
#     PYTHON=.venv/bin/python OUT=$OUT bash tools/device_check.sh [--quick]
#
# Exit status: 2 where torch sees no CUDA device; otherwise the number of steps that failed.
set -u
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-device_out}
QUICK=${1:-}
mkdir -p "$OUT"
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "device_check: torch sees no CUDA device" >&2
    exit 2
fi
"$PY" -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/device.txt"
failed=0
"$PY" -m pytest -q -p no:cacheprovider tests/capture/test_cuda.py tests/api/test_checkpoint_cuda.py \
    tests/sinks/test_wandb_log.py::test_cuda_samples_are_logged_once_their_events_completed \
    2>&1 | tee "$OUT/cuda_tests.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || failed=$((failed + 1))
"$PY" benchmarks/gpu.py $QUICK --out "$OUT/gpu.md" || failed=$((failed + 1))
"$PY" benchmarks/checkpoint.py --device cuda $QUICK --out "$OUT/checkpoint_cuda.md" \
    || failed=$((failed + 1))
echo "device_check: $failed step(s) failed; reports in $OUT"
exit "$failed"
