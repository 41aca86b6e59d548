#!/usr/bin/env bash
# Screenshots of what a TensorBoard user sees first (docs/screenshots/, see its README.md): serves LOGDIR (default
# runs/, after `make fit`) on a free port, shoots four views with headless Chromium, stops TensorBoard.
#   scripts/tensorboard_screenshots.sh [LOGDIR] [OUT_DIR]        (needs `chromium` on PATH; optional `optipng`)
# Not part of the test suite. `?forceSVG=true` makes the Time Series charts draw with SVG: headless Chromium
# has no WebGL, and without it most of their curves stay blank (the address a user opens draws them with WebGL).
set -euo pipefail
cd "$(dirname "$0")/.."
LOGDIR=${1:-runs}
OUT=${2:-docs/screenshots}
PY=${PY:-.venv/bin/python}
test -d "$LOGDIR" || { echo "no $LOGDIR/: run make fit first" >&2; exit 2; }
mkdir -p "$OUT"
PORT=$("$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
BASE="http://127.0.0.1:$PORT"
.venv/bin/tensorboard --logdir "$LOGDIR" --host 127.0.0.1 --port "$PORT" >/dev/null 2>&1 &
TB=$!
PROFILE=$(mktemp -d)
trap 'kill "$TB" 2>/dev/null || true; rm -rf "$PROFILE"' EXIT
for _ in $(seq 60); do curl -sf -o /dev/null "$BASE/data/runs" && break; sleep 1; done

shot() {  # shot FILE URL [WIDTH,HEIGHT]: one screenshot (default 1600x1000) after 20 s of virtual time
    rm -rf "$PROFILE"/*
    timeout 120 chromium --headless=new --no-sandbox --disable-gpu --disable-quic --no-first-run \
        --disable-background-networking --disable-component-update --disable-sync --user-data-dir="$PROFILE" \
        --window-size="${3:-1600,1000}" --virtual-time-budget=20000 --screenshot="$OUT/$1" "$2" >/dev/null 2>&1
    if command -v optipng >/dev/null; then optipng -quiet -o2 "$OUT/$1"; fi
    echo "$OUT/$1  <- $2"
}

PINNED=$("$PY" -c "from cropscale.runs.tensorboard import first_screen_url as u
print(u('127.0.0.1', $PORT).replace('/?', '/?forceSVG=true&', 1))")
shot 1_first_screen.png "$BASE/?forceSVG=true"
shot 2_pinned_first_screen.png "$PINNED"
shot 3_custom_scalars.png "$BASE/#custom_scalars" 1600,1900  # the quality and step-time-per-epoch groups
shot 4_hparams_table.png "$BASE/#hparams"
