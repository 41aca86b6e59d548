#!/usr/bin/env bash
# Rehearse the GPU check on the CPU, in an environment that holds only what the H200 image holds.
#
#   bash scripts/gpu_rehearsal.sh [CARRY]        (make gpu-rehearsal; CARRY default .gpu-carry, built first)
#
# 1. a throwaway venv (build/gpu-rehearsal-venv-KEY/, made anew when the list changes) with python3 and the
#    packages of scripts/h200_rehearsal_requirements.txt: the image's packages that cropscale imports, CPU
#    torch; then every distribution in it is checked against the image's list (scripts/h200_image_packages.txt):
#    one outside it fails the rehearsal, since the device would not have it;
# 2. the import check before the carry: it must name the packages the image lacks, one line each;
# 3. the wheels the device gets, for this Python: the carry's pure-Python wheels as they are and, for the
#    compiled one (rasterio), the same version's cp311 wheel (build/gpu-wheels-cp311/); the device gets the
#    carry's cp312 wheels. Installed the device's way: `pip install --no-index --no-deps --target`;
# 4. scripts/gpu_check.sh --dry-run from the carry's own project copy, with its data archive, OUT in
#    build/gpu-rehearsal/out: imports, `pytest --collect-only -m gpu` (zero errors), a one-step benchmark, a
#    one-epoch fit, callback-bench, pipeline-bench, the report, and the output folder checked (at most 6
#    files, no folders, no checkpoints, summary at most 6,000 characters).
#
# Differences from the device, besides the GPU: Python 3.11 here against 3.12 there, so cp311 wheels for
# the rehearsal and cp312 in the carry; CPU torch 2.13.0 here against 2.11.0+cu130 there; numpy 2.4 here
# against 2.5.2 there (2.5 needs Python >= 3.12). The other versions are what pip picks here.
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY="$(cd "${1:-.gpu-carry}" && pwd)"
R="$(pwd)/build/gpu-rehearsal"
PY3="${PYTHON:-python3}"
T0=$SECONDS
rm -rf "$R"
mkdir -p "$R"

# The venv is kept beside, keyed by the requirements and the Python, since installing CPU torch takes
# minutes on a shared machine; FRESH=1 (or another list) builds it anew. Its contents are checked each time.
KEY="$(cat scripts/h200_rehearsal_requirements.txt <("$PY3" -V) | sha256sum | cut -c1-12)"
VENV="$(pwd)/build/gpu-rehearsal-venv-$KEY"
VPY="$VENV/bin/python"
if [ "${FRESH:-0}" = 1 ] || [ ! -f "$VENV/.complete" ]; then
    echo "gpu-rehearsal: [1/4] a new venv with the H200 image's packages (CPU torch): $VENV" >&2
    rm -rf "$VENV"
    "$PY3" -m venv "$VENV"
    "$VPY" -m pip install -q -r scripts/h200_rehearsal_requirements.txt 2>&1 | grep -v "is ignored: it is neither" >&2 || true
    touch "$VENV/.complete"
else
    echo "gpu-rehearsal: [1/4] the venv of this package list, built before: $VENV (FRESH=1 builds it anew)" >&2
fi
"$VPY" -I - scripts/h200_image_packages.txt <<'EOF'
import re, sys
from importlib import metadata
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
image = {norm(l.split()[0]) for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")}
have = sorted({norm(d.metadata["Name"]) for d in metadata.distributions()})
extra = [n for n in have if n not in image]
if extra:
    sys.exit(f"gpu-rehearsal: the venv holds what the H200 image does not: {', '.join(extra)}")
print(f"gpu-rehearsal: {len(have)} distributions, every one in the H200 image's list")
EOF

echo "gpu-rehearsal: [2/4] imports before the carry (must name what the image lacks)" >&2
if PYTHONPATH="$CARRY/project" "$VPY" "$CARRY/project/scripts/gpu_imports.py" >"$R/imports-before.txt" 2>&1; then
    echo "gpu-rehearsal: the imports succeeded without the carry: this venv is not the image's" >&2; exit 1
fi
for m in jsonargparse docstring_parser typeshed_client pytorch_optimizer rasterio affine cligj click_plugins \
         cropscale.cli.main cropscale.bench.pipeline; do
    grep -q "^MISSING $m:" "$R/imports-before.txt" || { echo "gpu-rehearsal: no MISSING line for $m" >&2; exit 1; }
done
grep "^MISSING [a-z_]*:" "$R/imports-before.txt" | grep -v "^MISSING cropscale" | cut -c1-100 >&2
echo "  ... and $(grep -c '^MISSING cropscale' "$R/imports-before.txt") cropscale modules that import them" >&2

echo "gpu-rehearsal: [3/4] the carry's wheels for Python $("$VPY" -c 'import sys; print(*sys.version_info[:2], sep=".")')" >&2
mkdir -p "$R/wheels" build/gpu-wheels-cp311
for w in "$CARRY"/wheels/*.whl; do
    case "$(basename "$w")" in
        *-none-any.whl) cp "$w" "$R/wheels/" ;;
        *)  stem="$(basename "$w" | cut -d- -f1-2)"
            if ! ls build/gpu-wheels-cp311/"$stem"-cp311-*.whl >/dev/null 2>&1; then
                "$VPY" -m pip download -q --no-deps --only-binary=:all: -d build/gpu-wheels-cp311 \
                    "$(echo "$stem" | tr _ -  | sed 's/-\([0-9]\)/==\1/')" 2>&1 | grep -v "is ignored" >&2 || true
            fi
            cp build/gpu-wheels-cp311/"$stem"-cp311-*.whl "$R/wheels/" ;;
    esac
done
ls "$R/wheels" | sed 's/^/  /' >&2

echo "gpu-rehearsal: [4/4] scripts/gpu_check.sh --dry-run from the carry" >&2
rc=0
PYTHON="$VPY" WHEELS="$R/wheels" CARRY="$CARRY" OUT="$R/out" WORK="$R/work" \
    bash "$CARRY/project/scripts/gpu_check.sh" --dry-run >"$R/check.txt" 2>"$R/check.err" || rc=$?
cat "$R/check.txt"
[ "$rc" -eq 0 ] || { echo "gpu-rehearsal: the dry run exited $rc (stderr: $R/check.err)" >&2; tail -n 20 "$R/check.err" >&2; exit 1; }
"$VPY" - "$R/out" "$R/check.txt" <<'EOF'
import sys
from pathlib import Path
out, printed = Path(sys.argv[1]), Path(sys.argv[2]).read_text()
entries = sorted(out.iterdir())
bad = [p.name for p in entries if not p.is_file()] + [p.name for p in entries if p.suffix == ".ckpt"]
if len(entries) > 6 or bad:
    sys.exit(f"gpu-rehearsal: OUT holds {len(entries)} entries (at most 6 files, no folders or checkpoints): {bad}")
summary = (out / "summary.md").read_text()
if len(summary) > 6000 or not printed.endswith(summary):
    sys.exit("gpu-rehearsal: the summary is over 6,000 characters or not what was printed last")
print("gpu-rehearsal: OUT = " + ", ".join(f"{p.name} ({p.stat().st_size / 1024:.0f} KiB)" for p in entries)
      + f"; summary {len(summary)} characters, printed last")
EOF
echo "gpu-rehearsal: $(tail -n 1 "$CARRY/MANIFEST.txt")"
echo "gpu-rehearsal: passed in $((SECONDS - T0)) s"
