#!/usr/bin/env bash
# GPU check (issue 7), one call, under 8 minutes, on a machine with an NVIDIA GPU:
#   1. nvidia-smi (driver, power limit, persistence mode, clocks as the card reports them);
#   2. the tests marked `gpu` (pytest -m gpu);
#   3. the compute-only benchmark for 32-true, 16-mixed, bf16-mixed at batch sizes 1 2 4 and 32
#      (10 warm-up + 30 measured steps each), JSON written to ${OUT:-reports}/bench_gpu.json;
#   4. the study-format table, printed LAST.
# Exits 3 at once when there is no NVIDIA GPU usable by torch; 1 when the tests or the benchmark
# failed (the table is still printed); 0 otherwise.
#
# Runs from the source tree without installing (PYTHONPATH=.): it needs python3 with torch (CUDA
# build), numpy and scipy for the benchmark; pytest, lightning, torchmetrics, ... for the tests
# (test files whose imports are missing are reported as collection errors, the others still run).
# Settings: PYTHON (default python3), OUT (output folder), BATCHES (default "1 2 4 32"),
# DEVICE (default cuda), TEST_TIMEOUT (s, default 180), BENCH_TIMEOUT (s, default 270).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 3

PY="${PYTHON:-python3}"
OUT_DIR="${OUT:-reports}"
BATCHES="${BATCHES:-1 2 4 32}"
DEVICE="${DEVICE:-cuda}"
TEST_TIMEOUT="${TEST_TIMEOUT:-180}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-270}"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

fail_no_gpu() {
    echo "gpu_check: FAILED: $1" >&2
    echo "gpu_check: this script needs an NVIDIA GPU visible to torch; nothing was measured." >&2
    exit 3
}

command -v nvidia-smi >/dev/null 2>&1 || fail_no_gpu "nvidia-smi not found (no NVIDIA driver on this machine)"
echo "== nvidia-smi"
nvidia-smi || fail_no_gpu "nvidia-smi failed (driver not loaded or no GPU)"
"$PY" - <<'EOF' || fail_no_gpu "torch cannot use a CUDA GPU here (see the line above)"
import sys
try:
    import torch
except ImportError as err:
    print(f"gpu_check: cannot import torch: {err}", file=sys.stderr)
    sys.exit(1)
if not torch.cuda.is_available():
    print(f"gpu_check: torch {torch.__version__} (CUDA build: {torch.version.cuda}) sees no CUDA device", file=sys.stderr)
    sys.exit(1)
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device 0: {torch.cuda.get_device_name(0)}")
EOF

mkdir -p "$OUT_DIR" || exit 3

echo "== pytest -m gpu"
timeout "$TEST_TIMEOUT" "$PY" -m pytest -q -m gpu -p no:cacheprovider --continue-on-collection-errors tests \
    2>&1 | tee "$OUT_DIR/gpu_tests.log"
tests_rc=${PIPESTATUS[0]}

echo "== benchmark (${BATCHES}) -> $OUT_DIR/bench_gpu.json"
# shellcheck disable=SC2086  # BATCHES is a list of numbers
timeout "$BENCH_TIMEOUT" "$PY" -m cropscale.bench.step --device "$DEVICE" \
    --precision 32-true 16-mixed bf16-mixed --batch-sizes $BATCHES --warmup 10 --iterations 30 \
    --details --output "$OUT_DIR/bench_gpu.json" >"$OUT_DIR/bench_gpu.txt" 2>&1
bench_rc=$?

status=0
case "$tests_rc" in
    0) echo "gpu_check: gpu tests passed" ;;
    5) echo "gpu_check: no test marked gpu was collected" ;;
    124) echo "gpu_check: FAILED: gpu tests ran past ${TEST_TIMEOUT} s"; status=1 ;;
    *) echo "gpu_check: FAILED: gpu tests exit status $tests_rc (see $OUT_DIR/gpu_tests.log)"; status=1 ;;
esac
case "$bench_rc" in
    0) echo "gpu_check: benchmark finished" ;;
    124) echo "gpu_check: FAILED: benchmark ran past ${BENCH_TIMEOUT} s (partial output below, no JSON)"; status=1 ;;
    *) echo "gpu_check: FAILED: benchmark exit status $bench_rc"; status=1 ;;
esac
echo "== benchmark table (measured-microbenchmark)"
cat "$OUT_DIR/bench_gpu.txt"
exit "$status"
