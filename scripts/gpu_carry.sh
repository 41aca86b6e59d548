#!/usr/bin/env bash
# Build the GPU check's carry: everything the lent H200 needs that its image lacks, in one folder.
#
#   bash scripts/gpu_carry.sh [CARRY]          (make gpu-carry; CARRY default .gpu-carry, ignored by git)
#
# CARRY/wheels/     the cp312 manylinux x86_64 wheels of the packages the image's python3 (3.12) lacks
#                   (scripts/h200_image_packages.txt is its package list): jsonargparse, docstring-parser,
#                   typeshed-client, pytorch-optimizer, rasterio and the three rasterio needs that the image
#                   lacks (affine, cligj, click-plugins), the versions this project is tested with here
# CARRY/project/    a copy of the project's source: cropscale/, tests/, configs/, scripts/, pyproject.toml
#                   (the pytest settings and markers); the GPU check runs from here
# CARRY/data/       the bundled sample (worldcereal-flanders) as one .tar.gz of copies, not links (a link
#                   travels dangling); gpu_check.sh unpacks it into CARRY/shared/data/ on the device
# CARRY/MANIFEST.txt  what is in it and its size
#
# Checks, each failing the build with one line: a carried package the image already holds (carry one only
# for another version), a wheel's requirement neither the image nor the carry holds, two versions of one
# package, and the 64 MiB the device takes per call (the carry plus the repository's tracked files).
#
# Settings (environment): DATA_ROOT (default data/worldcereal-flanders, else ../shared/data/...), PIP_PYTHON
# (the python whose pip downloads, default python3), LIMIT_MIB (64). Downloads are kept in
# build/gpu-wheels-cp312/ so a rebuild does not ask the registry again.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
CARRY="${1:-.gpu-carry}"
PIP_PY="${PIP_PYTHON:-python3}"
LIMIT_MIB="${LIMIT_MIB:-64}"
CACHE="build/gpu-wheels-cp312"

# name==version of every carried wheel (pure Python except rasterio)
CARRIED=(jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0 pytorch-optimizer==4.1.0
         rasterio==1.4.4 affine==3.0.1 cligj==0.7.2 click-plugins==1.1.1.2)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)

data="${DATA_ROOT:-}"
if [ -z "$data" ]; then
    for d in data/worldcereal-flanders ../shared/data/worldcereal-flanders; do
        [ -f "$d/metadata.geojson" ] && data="$d" && break
    done
fi
if [ -z "$data" ] || [ ! -f "$data/metadata.geojson" ]; then
    echo "gpu-carry: no bundled sample (data/worldcereal-flanders or ../shared/data/worldcereal-flanders; set DATA_ROOT)" >&2
    exit 1
fi

mkdir -p "$CACHE"
plat=()
for p in "${PLATFORMS[@]}"; do plat+=(--platform "$p"); done
for spec in "${CARRIED[@]}"; do
    name="${spec%%==*}"; version="${spec##*==}"
    stem="$(echo "$name" | tr '-' '_')-$version-"
    if ! ls "$CACHE/$stem"*.whl >/dev/null 2>&1; then
        "$PIP_PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --abi cp312 "${plat[@]}" -d "$CACHE" "$spec" 2>&1 | grep -v "is ignored: it is neither" >&2 || true
    fi
    ls "$CACHE/$stem"*.whl >/dev/null 2>&1 || { echo "gpu-carry: no cp312 manylinux x86_64 wheel of $spec" >&2; exit 1; }
done

rm -rf "$CARRY"
mkdir -p "$CARRY/wheels" "$CARRY/project" "$CARRY/data"
for spec in "${CARRIED[@]}"; do
    name="${spec%%==*}"; version="${spec##*==}"
    cp "$CACHE/$(echo "$name" | tr '-' '_')-$version-"*.whl "$CARRY/wheels/"
done

# the project's own source (copies; no caches, no build outputs)
tar --exclude=__pycache__ --exclude='*.pyc' -cf - cropscale tests configs scripts pyproject.toml README.md \
    | tar -C "$CARRY/project" -xf -

# checks and the data archive (Python's standard library only)
"$PIP_PY" - "$CARRY" "$data" "$ROOT" "$LIMIT_MIB" <<'EOF'
import re, subprocess, sys, tarfile, zipfile
from pathlib import Path

carry, data, root, limit_mib = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4])
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
image = {}
for line in (root / "scripts" / "h200_image_packages.txt").read_text().splitlines():
    if line.strip() and not line.startswith("#"):
        parts = line.split()
        image[norm(parts[0])] = parts[1] if len(parts) > 1 else None
wheels = sorted((carry / "wheels").glob("*.whl"))
carried = {}
for w in wheels:
    with zipfile.ZipFile(w) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    name = norm(re.search(r"^Name: (.+)$", meta, re.M).group(1).strip())
    if name in carried:
        sys.exit(f"gpu-carry: two versions of {name} in {carry}/wheels")
    if name in image:
        sys.exit(f"gpu-carry: the image already holds {name} ({image[name] or 'version unknown'}); carry it only for another version")
    reqs = [r.split(";")[0].strip() for r in re.findall(r"^Requires-Dist: (.+)$", meta, re.M) if "extra ==" not in r]
    carried[name] = (w, [norm(re.split(r"[ (<>=!~\[]", r, maxsplit=1)[0]) for r in reqs])
for name, (w, reqs) in carried.items():
    for r in reqs:
        if r not in image and r not in carried:
            sys.exit(f"gpu-carry: {w.name} needs {r}, which neither the image nor the carry holds")

archive = carry / "data" / f"{data.resolve().name}.tar.gz"
with tarfile.open(archive, "w:gz", dereference=True) as tar:  # copies of the files, never links
    tar.add(data.resolve(), arcname=data.resolve().name,
            filter=lambda ti: None if "__pycache__" in ti.name else ti)
members = tarfile.open(archive).getmembers()
raw = sum(m.size for m in members if m.isfile())

def size(path):
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())

tracked = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout.split(b"\0")
tree = sum((root / t.decode()).stat().st_size for t in tracked if t and (root / t.decode()).is_file())
parts = {"wheels": size(carry / "wheels"), "project": size(carry / "project"), "data": size(carry / "data")}
total = sum(parts.values())
mib = 2**20
lines = [f"cropscale GPU-check carry ({carry})", "wheels (cp312, manylinux x86_64; the H200 image lacks these):"]
lines += [f"  {w.name}  {w.stat().st_size / mib:.2f} MiB" for w in wheels]
lines += [f"project source: {parts['project'] / mib:.2f} MiB",
          f"data: {archive.name}  {parts['data'] / mib:.2f} MiB ({len(members)} entries, {raw / mib:.2f} MiB unpacked)",
          f"carry total: {total / mib:.2f} MiB; with the repository's tracked files ({tree / mib:.2f} MiB): "
          f"{(total + tree) / mib:.2f} MiB of the device's {limit_mib:.0f} MiB per call"]
(carry / "MANIFEST.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
if total + tree > limit_mib * mib:
    sys.exit(f"gpu-carry: {(total + tree) / mib:.2f} MiB is over the device's {limit_mib:.0f} MiB")
EOF
