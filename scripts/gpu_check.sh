#!/usr/bin/env bash
# GPU check: one device call, at most 6 minutes on the lent H200 as its image is; summary printed last.
#
#   bash .gpu-carry/project/scripts/gpu_check.sh            on the device (carry: [".gpu-carry"])
#   bash scripts/gpu_check.sh --dry-run                       CPU dry mode (make gpu-rehearsal runs it)
#
# It needs no `make install`, no ../shared and no pip-installed project: the packages the image lacks come
# as wheels in the carry (make gpu-carry; scripts/gpu_carry.sh says what is in it), installed with
# `pip install --no-index --no-deps --target SITE` (never a registry) onto PYTHONPATH beside this project's
# source; the pytest plugin is loaded with `-p cropscale.scaling.pytest_plugin`; the bundled sample is
# unpacked from the carry's archive into CARRY/shared/data/ (where tests/conftest.py looks).
#
# Steps, by value, each with its own time limit within the whole budget; a failed step never stops the rest:
#    1. imports (one line per missing piece), nvidia-smi
#    2. compute-only benchmark, eager: FP32, BF16-mixed, FP16-mixed (TF32 off), then TF32, batch 1-64:
#       samples/s, MFU against the attainable peak, peak memory, NVML energy per sample
#    3. torch.compile (default) and CUDA graphs (compile mode reduce-overhead), BF16, at the best eager batch
#    4. 2-epoch BF16 and FP16 fits of the bundled sample with every callback (checkpoints stay in WORK); each
#       fit's diagnosis (run.json "diagnosis": what limits it, the bound, what to try) is printed in the summary.
#       Host gaps and launch overhead need the device timeline: the fits' step windows are CUDA events, so a gap
#       the host leaves between steps shows as device-idle data wait, transfer or remainder (judged by the
#       diagnosis's input / transfer / loop-overhead rules); gaps between kernels inside forward and backward and
#       launch overhead stay inside those windows (judged only by a profiler trace, not run here), as the
#       summary's "host gaps" line says
#    5. callback overhead on the GPU (callback-bench --device cuda)
#    6. the input-pipeline ratio (pipeline-bench)
#    7. the tests marked gpu
#    8. the report; scripts/gpu_summary.py gathers every figure
#
# What comes back ($OUT, at most 6 files, no folders, no checkpoints): gpu_check.json (every figure),
# summary.md (the summary, at most 6,000 characters, also printed last), report.png (the report's
# samples/s figure), logs_tail.txt (the last lines of every step's log). Everything else stays in WORK.
#
# --dry-run (no GPU needed): the same steps on the CPU, sized down: imports, `pytest --collect-only -m gpu`
# (zero errors), a one-step benchmark, a one-epoch fit, callback-bench and pipeline-bench of a few steps,
# the report and the output folder; TF32, the compiled / CUDA-graph steps and the FP16 fit are listed
# as not rehearsed. Without --dry-run and without a usable NVIDIA GPU: one line, exit 0.
#
# Exit status 1 when a step failed or ran past its limit, 0 otherwise.
#
# Settings (environment): PYTHON (default python3), OUT (default reports/gpu_check under the project),
# WORK (default a new folder under /tmp), CARRY (default the folder holding this project copy, else
# .gpu-carry), WHEELS (default CARRY/wheels), DATA_ROOT (default: the carry's sample, else
# data/worldcereal-flanders, else ../shared/data/worldcereal-flanders), BUDGET_S (whole script, default 345;
# 1200 with --dry-run), SCALE (--dry-run only: each step's limit times this, default 4), BATCHES (default
# "1 2 4 8 16 32 64").
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
SOURCE="$(pwd)"  # the project (or the carry's copy of it); the check runs from a copy in WORK
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
PY="${PYTHON:-python3}"
BATCHES="${BATCHES:-1 2 4 8 16 32 64}"
# the limits are the device's; a CPU dry run (2 shared cores, cold imports) gets SCALE times each
if [ "$DRY" -eq 1 ]; then SCALE="${SCALE:-4}"; BUDGET_S="${BUDGET_S:-1200}"; else SCALE=1; BUDGET_S="${BUDGET_S:-345}"; fi
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
START=$SECONDS

# --- no GPU and no --dry-run: one line, exit 0 ----------------------------------------------------
if [ "$DRY" -eq 0 ]; then
    why=""
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        why="no nvidia-smi (no NVIDIA driver)"
    elif ! nvidia-smi -L >/dev/null 2>&1; then
        why="nvidia-smi finds no GPU"
    elif ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
        why="$PY has no torch that can use a CUDA GPU"
    fi
    if [ -n "$why" ]; then
        echo "gpu_check: no NVIDIA GPU usable here ($why): nothing checked, nothing measured; GPU figures still unmeasured (--dry-run rehearses on the CPU)."
        exit 0
    fi
fi

if [ -z "${CARRY:-}" ]; then
    if [ -d "$SOURCE/../wheels" ]; then CARRY="$(cd "$SOURCE/.." && pwd)"; else CARRY="$SOURCE/.gpu-carry"; fi
fi
WHEELS="${WHEELS:-$CARRY/wheels}"
WORK="${WORK:-$(mktemp -d /tmp/cropscale-gpu-check.XXXXXX)}"
OUT_DIR="${OUT:-$SOURCE/reports/gpu_check}"
mkdir -p "$WORK/logs" "$WORK/json" "$OUT_DIR" || exit 1
WORK="$(cd "$WORK" && pwd)"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
# WORK/project: a copy of the source (nothing is written into the carry, which travels as built);
# WORK/shared/data: the sample, where the copy's tests/conftest.py looks (../shared/data)
PROJECT="$WORK/project"
rm -rf "$PROJECT" && mkdir -p "$PROJECT" || exit 1
(tar -C "$SOURCE" --exclude=__pycache__ -cf - cropscale tests configs scripts pyproject.toml \
    | tar -C "$PROJECT" -xf -) || exit 1
cd "$PROJECT" || exit 1
STEPS="$WORK/steps.tsv"
: >"$STEPS"
status=0
if [ "$DRY" -eq 1 ]; then DEV=cpu; ACC=cpu; export OMP_NUM_THREADS=1; else DEV=cuda; ACC=gpu; fi

record() {  # record NAME STATUS SECONDS LIMIT LOG NOTE
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "${6:-}" >>"$STEPS"
}

limit_for() {  # limit_for OWN_LIMIT LATER_STEPS: own limit (x SCALE), cut to the budget left less 5 s a later step
    local rest=$((BUDGET_S - (SECONDS - START) - 5 * $2)) own=$(($1 * SCALE))
    [ "$rest" -gt "$own" ] && rest="$own"
    echo "$rest"
}

run_step() {  # run_step NAME OWN_LIMIT LATER_STEPS COMMAND...: runs with its timeout, records the outcome
    local name="$1" own="$2" later="$3"
    shift 3
    local log="$WORK/logs/$name.log" limit t0=$SECONDS rc
    limit="$(limit_for "$own" "$later")"
    if [ "$limit" -lt 5 ]; then
        record "$name" skipped 0 "$limit" "$log" "budget spent (${BUDGET_S} s)"; status=1; return 0
    fi
    echo "== $name (limit ${limit} s)" >&2
    timeout --kill-after=5 "$limit" "$@" >"$log" 2>&1
    rc=$?
    case "$rc" in
        0) record "$name" ok $((SECONDS - t0)) "$limit" "$log" ;;
        124|137) record "$name" timeout $((SECONDS - t0)) "$limit" "$log" "past ${limit} s"; status=1 ;;
        *) record "$name" failed $((SECONDS - t0)) "$limit" "$log" "exit status $rc"; status=1 ;;
    esac
    tail -n 2 "$log" | cut -c1-200 | sed "s/^/   /" >&2
    return 0
}

not_run() {  # not_run NAME WHY
    record "$1" "not-rehearsed" 0 0 "" "$2"
}

# --- 0. the carry: wheels onto PYTHONPATH (never a registry), the sample unpacked ----------------
SITE="$WORK/site"
t0=$SECONDS
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$WHEELS"/*.whl >"$WORK/logs/install.log" 2>&1; then
        record install ok $((SECONDS - t0)) 0 "$WORK/logs/install.log" "$(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS"
    else
        record install failed $((SECONDS - t0)) 0 "$WORK/logs/install.log" "pip install --no-index failed"; status=1
    fi
else
    record install failed 0 0 "" "no wheels in $WHEELS (make gpu-carry)"; status=1
fi
export PYTHONPATH="$PROJECT:$SITE${PYTHONPATH:+:$PYTHONPATH}"

DATA="${DATA_ROOT:-}"
if [ -z "$DATA" ] && [ -f "$CARRY/data/worldcereal-flanders.tar.gz" ]; then
    mkdir -p "$WORK/shared/data" && tar -C "$WORK/shared/data" -xzf "$CARRY/data/worldcereal-flanders.tar.gz"
    DATA="$WORK/shared/data/worldcereal-flanders"
fi
if [ -z "$DATA" ]; then
    for d in "$SOURCE/data/worldcereal-flanders" "$SOURCE/../shared/data/worldcereal-flanders"; do
        [ -f "$d/metadata.geojson" ] && DATA="$(cd "$d" && pwd)" && break
    done
fi
if [ -n "$DATA" ] && [ ! -e "$WORK/shared/data/worldcereal-flanders" ]; then
    mkdir -p "$WORK/shared/data" && ln -s "$DATA" "$WORK/shared/data/worldcereal-flanders"
fi
if [ -n "$DATA" ] && [ -f "$DATA/metadata.geojson" ]; then
    record data ok 0 0 "" "$DATA"
else
    record data failed 0 0 "" "no bundled sample (carry it: make gpu-carry; or set DATA_ROOT)"; status=1; DATA=""
fi

# --- 1. imports, nvidia-smi ---------------------------------------------------------------------
run_step imports 20 11 "$PY" "$PROJECT/scripts/gpu_imports.py" --json "$WORK/json/imports.json"
if [ "$DRY" -eq 0 ]; then
    run_step nvidia-smi 10 10 bash -c 'nvidia-smi; nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,memory.total --format=csv'
else
    not_run nvidia-smi "dry mode: no GPU"
fi

# --- 2. compute-only benchmark, eager -----------------------------------------------------------
if [ "$DRY" -eq 0 ]; then
    # shellcheck disable=SC2086  # BATCHES is a list of numbers
    run_step bench-eager 60 9 "$PY" -m cropscale benchmark --device cuda --precision 32-true bf16-mixed 16-mixed \
        --batch-sizes $BATCHES --warmup 5 --iterations 20 --stop-at-oom --max-seconds 45 --details \
        --json "$WORK/json/bench-eager.json"
    # shellcheck disable=SC2086
    run_step bench-tf32 20 8 "$PY" -m cropscale benchmark --device cuda --precision 32-true --tf32 \
        --batch-sizes $BATCHES --warmup 5 --iterations 20 --stop-at-oom --max-seconds 12 --details \
        --json "$WORK/json/bench-tf32.json"
else
    run_step bench-eager 60 9 "$PY" -m cropscale benchmark --device cpu --precision 32-true --batch-sizes 1 \
        --warmup 0 --iterations 1 --t2 4 --t1 2 --crop-size 16 --threads 1 --details \
        --json "$WORK/json/bench-eager.json"
    not_run bench-tf32 "dry mode: TF32 is a CUDA switch"
fi

# --- 3. compiled and CUDA graphs at the best eager BF16 batch (FP32 in dry mode) ------------------
BEST="$("$PY" "$PROJECT/scripts/gpu_summary.py" --best-batch "$WORK/json/bench-eager.json" \
    --precision "$([ "$DRY" -eq 0 ] && echo bf16-mixed || echo 32-true)" 2>/dev/null || echo 16)"
if [ "$DRY" -eq 0 ]; then
    for mode in default reduce-overhead; do
        run_step "bench-compile-$mode" 40 7 "$PY" -m cropscale benchmark --device cuda --compile --compile-mode "$mode" \
            --precision bf16-mixed --batch-sizes "$BEST" --warmup 5 --iterations 20 --details \
            --json "$WORK/json/bench-compile-$mode.json"
    done
else
    not_run bench-compile-default "dry mode: would compile at batch $BEST"
    not_run bench-compile-reduce-overhead "dry mode: would capture CUDA graphs at batch $BEST"
fi

# --- 4. fits of the bundled sample with every callback ------------------------------------------
fit() {  # fit NAME PRECISION EPOCHS LATER EXTRA...
    local name="$1" precision="$2" epochs="$3" later="$4"
    shift 4
    if [ -z "$DATA" ]; then record "$name" skipped 0 0 "" "no bundled sample"; return 0; fi
    run_step "$name" 35 "$later" "$PY" -m cropscale fit --trainer.accelerator="$ACC" --trainer.devices=1 \
        --trainer.max_epochs="$epochs" --trainer.precision="$precision" --data.root="$DATA" \
        --trainer.logger.init_args.save_dir="$WORK/runs" --trainer.logger.init_args.name="$name" "$@"
}
if [ "$DRY" -eq 0 ]; then
    # 2 x 64 crops of fold 1 at batch 4: 32 steps an epoch (the default 8 crops a patch gives 4)
    fit fit-bf16 bf16-mixed 2 5 --data.num_workers=2 --data.pin_memory=true --data.samples_per_patch=64
    fit fit-fp16 16-mixed 2 4 --data.num_workers=2 --data.pin_memory=true --data.samples_per_patch=64
else
    fit fit-fp32 32-true 1 5 --data.num_workers=0 --data.batch_size=1 --data.crop_size=16 \
        --trainer.limit_train_batches=8 --trainer.limit_val_batches=1
    not_run fit-fp16 "dry mode: one FP32 epoch only"
fi

# --- 5. callback overhead; 6. pipeline ratio --------------------------------------------------------
if [ "$DRY" -eq 0 ]; then
    run_step callback-bench 25 3 "$PY" -m cropscale callback-bench --device cuda --model network --steps 40 \
        --repeats 2 --json "$WORK/json/callback-bench.json"
    [ -z "$DATA" ] && record pipeline skipped 0 0 "" "no bundled sample"
    [ -n "$DATA" ] && run_step pipeline 20 2 "$PY" -m cropscale pipeline-bench --root "$DATA" --device cuda \
        --precision bf16-mixed --batch-size 4 --workers 2 --steps 20 --json "$WORK/json/pipeline.json"
else
    run_step callback-bench 25 3 "$PY" -m cropscale callback-bench --device cpu --steps 12 --warmup 2 --block 6 \
        --repeats 1 --json "$WORK/json/callback-bench.json"
    [ -z "$DATA" ] && record pipeline skipped 0 0 "" "no bundled sample"
    [ -n "$DATA" ] && run_step pipeline 40 2 "$PY" -m cropscale pipeline-bench --root "$DATA" --device cpu \
        --batch-size 1 --steps 2 --warmup 1 --t2 4 --t1 2 --crop-size 16 --threads 1 --json "$WORK/json/pipeline.json"
fi

# --- 7. the gpu tests -----------------------------------------------------------------------------
PLUGIN=(-p cropscale.scaling.pytest_plugin)
if "$PY" -c "import importlib.metadata as m, sys; sys.exit(0 if any(e.name == 'cropscale_scaling' for e in m.entry_points(group='pytest11')) else 1)" 2>/dev/null; then
    PLUGIN=()  # the project is pip-installed here: pytest loads its plugin already
fi
if [ "$DRY" -eq 0 ]; then
    run_step gpu-tests 40 1 "$PY" -m pytest -q -m gpu -p no:cacheprovider "${PLUGIN[@]}" \
        --junitxml="$WORK/json/gpu-tests.xml" tests
else
    run_step gpu-tests 40 1 "$PY" -m pytest -q --collect-only -m gpu -p no:cacheprovider "${PLUGIN[@]}" tests
fi

# --- 8. the report, the figures gathered, the summary printed last ------------------------------
inputs=()
for d in "$WORK"/runs/*/version_*; do [ -d "$d" ] && inputs+=("$d"); done
for f in "$WORK"/json/bench-*.json; do [ -s "$f" ] && inputs+=("$f"); done
if [ "${#inputs[@]}" -gt 0 ]; then
    run_step report 15 0 "$PY" -m cropscale report "${inputs[@]}" --output "$WORK/report"
else
    record report skipped 0 0 "" "nothing to report"
fi
"$PY" "$PROJECT/scripts/gpu_summary.py" --work "$WORK" --output "$OUT_DIR" --mode "$([ "$DRY" -eq 1 ] && echo dry-run-cpu || echo gpu)" \
    --elapsed "$((SECONDS - START))" --budget "$BUDGET_S" --carry "$CARRY" || status=1
exit "$status"
