#!/usr/bin/env bash
# GPU check: one call, at most 8 minutes on one NVIDIA GPU, everything written under $OUT.
#
#   0. the machine: nvidia-smi, torch / CUDA versions                      -> $OUT/nvidia_smi.txt
#   1. the tests marked `gpu` (pytest -m gpu)                              -> $OUT/gpu_tests.log
#   2. compute-only benchmark, eager: FP32, AMP FP16, AMP BF16 (TF32 off) and TF32, batch sizes
#      1 2 4 8 16 32 64, stopping at out-of-memory                         -> $OUT/bench_eager.json, bench_tf32.json
#   3. the same compiled (torch.compile), within a time budget; the configurations the budget
#      leaves out are listed as "not run"                                  -> $OUT/bench_compiled*.json
#   4. a 2-epoch fit of the bundled sample with every scaling callback     -> $OUT/runs/gpu_check/version_0/
#   5. the input-pipeline ratio (end-to-end / compute-only samples/s)      -> $OUT/pipeline.json
#   6. the report of all of it (Markdown, CSV, PNG)                        -> $OUT/report/
#   7. a summary, printed last                                             -> $OUT/summary.txt
#
# Without an NVIDIA GPU usable by torch it prints one line and exits 0 (nothing to check here).
# Exit status 1 when a step failed or ran past its time (the others still run), 0 otherwise.
#
# Settings (environment): PYTHON (default .venv/bin/python if present, else python3), OUT (default
# reports/gpu_check), BATCHES (default "1 2 4 8 16 32 64"), DATA_ROOT (default data/worldcereal-flanders,
# else ../shared/data/worldcereal-flanders), BUDGET_S (whole script, default 480).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

if [ -x .venv/bin/python ]; then DEFAULT_PY=.venv/bin/python; else DEFAULT_PY=python3; fi
PY="${PYTHON:-$DEFAULT_PY}"
OUT_DIR="${OUT:-reports/gpu_check}"
BATCHES="${BATCHES:-1 2 4 8 16 32 64}"
BUDGET_S="${BUDGET_S:-480}"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
START=$SECONDS

# --- no GPU: one line, exit 0 -------------------------------------------------------------------
why=""
if ! command -v nvidia-smi >/dev/null 2>&1; then
    why="no nvidia-smi (no NVIDIA driver)"
elif ! nvidia-smi -L >/dev/null 2>&1; then
    why="nvidia-smi finds no GPU"
elif ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    why="$PY has no torch that can use a CUDA GPU"
fi
if [ -n "$why" ]; then
    echo "gpu_check: no NVIDIA GPU usable here ($why): nothing checked, nothing measured; GPU figures still unmeasured."
    exit 0
fi

mkdir -p "$OUT_DIR" || exit 1
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
status=0
declare -a RESULTS=()

left() {  # seconds of the budget left, minus a reserve for the steps after this one
    local reserve="$1"
    local rest=$((BUDGET_S - (SECONDS - START) - reserve))
    [ "$rest" -lt 10 ] && rest=10
    echo "$rest"
}

run_step() {  # run_step NAME LIMIT_S LOG COMMAND...: runs with a timeout, records the outcome
    local name="$1" limit="$2" log="$3"
    shift 3
    local t0=$SECONDS
    echo "== $name (limit ${limit} s) -> $log" >&2
    timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
    local rc=$?
    local took=$((SECONDS - t0))
    case "$rc" in
        0) RESULTS+=("ok      $name (${took} s)") ;;
        124|137) RESULTS+=("TIMEOUT $name: past ${limit} s (partial output in $log)"); status=1 ;;
        *) RESULTS+=("FAILED  $name: exit status $rc (see $log)"); status=1 ;;
    esac
    tail -n 3 "$log" | sed "s/^/   /" >&2
    return 0
}

# --- 0. the machine -----------------------------------------------------------------------------
{
    nvidia-smi
    nvidia-smi --query-gpu=name,driver_version,power.limit,persistence_mode,clocks.max.sm,memory.total --format=csv
    "$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'device 0:', torch.cuda.get_device_name(0))"
} >"$OUT_DIR/nvidia_smi.txt" 2>&1
RESULTS+=("ok      machine: $(tail -n 1 "$OUT_DIR/nvidia_smi.txt")")

# --- 1. gpu tests -------------------------------------------------------------------------------
run_step "pytest -m gpu" "$(left 400)" "$OUT_DIR/gpu_tests.log" \
    "$PY" -m pytest -q -m gpu -p no:cacheprovider tests

# --- 2. compute-only benchmark, eager ------------------------------------------------------------
# shellcheck disable=SC2086  # BATCHES is a list of numbers
run_step "benchmark eager FP32 / AMP FP16 / AMP BF16" "$(left 300)" "$OUT_DIR/bench_eager.txt" \
    "$PY" -m cropscale benchmark --device cuda --precision 32-true 16-mixed bf16-mixed --batch-sizes $BATCHES \
    --warmup 5 --iterations 20 --stop-at-oom --details --output "$OUT_DIR/bench_eager.json"
# shellcheck disable=SC2086
run_step "benchmark eager TF32" "$(left 280)" "$OUT_DIR/bench_tf32.txt" \
    "$PY" -m cropscale benchmark --device cuda --precision 32-true --tf32 --batch-sizes $BATCHES \
    --warmup 5 --iterations 20 --stop-at-oom --details --output "$OUT_DIR/bench_tf32.json"

# --- 3. compiled, within a budget (compilation takes tens of seconds per configuration) ---------
# Batch size outer, precision inner: every precision gets its small batches before any gets batch 64.
# No configuration starts later than 80 s before its window closes; the JSON is rewritten after each.
compiled() {  # compiled NAME WINDOW_S JSON ARGS...
    local name="$1" window="$2" json="$3"
    shift 3
    if [ "$window" -lt 100 ]; then
        RESULTS+=("SKIPPED $name: ${window} s of the budget left, too little to compile"); return 0
    fi
    # shellcheck disable=SC2086  # BATCHES is a list of numbers
    run_step "$name" "$window" "${json%.json}.txt" \
        "$PY" -m cropscale benchmark --device cuda --compile "$@" --batch-sizes $BATCHES --order batch \
        --warmup 5 --iterations 20 --stop-at-oom --max-seconds "$((window - 80))" --details --output "$json"
}
compiled "benchmark compiled FP32 / AMP FP16 / AMP BF16" "$(( $(left 130) * 3 / 4 ))" \
    "$OUT_DIR/bench_compiled.json" --precision 32-true 16-mixed bf16-mixed
compiled "benchmark compiled TF32" "$(left 130)" "$OUT_DIR/bench_compiled_tf32.json" --precision 32-true --tf32

# --- 4. 2-epoch fit of the bundled sample with every scaling callback ---------------------------
DATA="${DATA_ROOT:-}"
if [ -z "$DATA" ]; then
    for d in data/worldcereal-flanders ../shared/data/worldcereal-flanders; do
        [ -f "$d/metadata.geojson" ] && DATA="$d" && break
    done
fi
RUN_DIR=""
if [ -n "$DATA" ] && [ -f "$DATA/metadata.geojson" ]; then
    run_step "fit, 2 epochs, bundled sample, all scaling callbacks, AMP BF16" "$(left 60)" "$OUT_DIR/fit.log" \
        "$PY" -m cropscale fit --trainer.accelerator=gpu --trainer.devices=1 --trainer.max_epochs=2 \
        --trainer.precision=bf16-mixed --data.root="$DATA" --data.num_workers=2 --data.pin_memory=true \
        --data.persistent_workers=true \
        --trainer.logger.init_args.save_dir="$OUT_DIR/runs" --trainer.logger.init_args.name=gpu_check
    RUN_DIR="$(ls -d "$OUT_DIR"/runs/gpu_check/version_* 2>/dev/null | tail -n 1)"

    # --- 5. input-pipeline ratio -----------------------------------------------------------------
    run_step "pipeline ratio (end-to-end / compute-only), AMP BF16 batch 4" "$(left 25)" "$OUT_DIR/pipeline.txt" \
        "$PY" -m cropscale pipeline-bench --root "$DATA" --device cuda --precision bf16-mixed --batch-size 4 \
        --workers 2 --json "$OUT_DIR/pipeline.json"
else
    RESULTS+=("SKIPPED fit and pipeline ratio: no bundled sample (set DATA_ROOT, or carry data/worldcereal-flanders)")
    status=1
fi

# --- 6. the report ------------------------------------------------------------------------------
inputs=()
[ -n "$RUN_DIR" ] && inputs+=("$RUN_DIR")
for f in bench_eager bench_tf32 bench_compiled bench_compiled_tf32; do
    [ -s "$OUT_DIR/$f.json" ] && inputs+=("$OUT_DIR/$f.json")
done
if [ "${#inputs[@]}" -gt 0 ]; then
    run_step "report" "$(left 0)" "$OUT_DIR/report.log" \
        "$PY" -m cropscale report "${inputs[@]}" --out "$OUT_DIR/report"
fi

# --- 7. summary, printed last -------------------------------------------------------------------
{
    echo "gpu_check: $(tail -n 1 "$OUT_DIR/nvidia_smi.txt"), $((SECONDS - START)) s of a ${BUDGET_S} s budget"
    printf '  %s\n' "${RESULTS[@]}"
    for f in bench_eager bench_tf32 bench_compiled bench_compiled_tf32; do
        [ -s "$OUT_DIR/$f.txt" ] && { echo; echo "== $f (measured-microbenchmark)"; grep -v '^wrote ' "$OUT_DIR/$f.txt" | grep -v '^benchmark: '; }
    done
    [ -s "$OUT_DIR/pipeline.txt" ] && { echo; echo "== pipeline"; grep -v '^pipeline-bench: \[' "$OUT_DIR/pipeline.txt"; }
    [ -s "$OUT_DIR/fit.log" ] && { echo; echo "== fit summary"; tail -n 25 "$OUT_DIR/fit.log"; }
    echo
    echo "everything is under $OUT_DIR (report: $OUT_DIR/report/report.md)"
    [ "$status" -eq 0 ] && echo "gpu_check: every step finished" || echo "gpu_check: some steps FAILED or ran out of time (see above)"
} | tee "$OUT_DIR/summary.txt"
exit "$status"
