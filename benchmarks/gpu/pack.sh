#!/usr/bin/env bash
# Pack what the GPU run needs onto the device, here (a machine with PyPI), into DEST (default
# <checkout>/.gpu, which .git/info/exclude must ignore):
#   DEST/whl/        the wheels of ../shared/gpu/wheels-vllm-0.26.0-device.txt (vLLM 0.26.0, speculators 0.9.0,
#                    hs-connectors 0.9.0 and what the device image lacks) + specrig's laptop-side deps
#                    the image lacks (fabric, invoke, paramiko and theirs) + py-spy
#   DEST/parts/pNN   whl/ as one tar, split into 58 MiB parts: a device call carries 64 MiB at most
#   DEST/tree/       the specrig tree to run (git archive of REV, default HEAD of this checkout)
# Usage: benchmarks/gpu/pack.sh [DEST] [REV]
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$here/.gpu}
rev=${2:-HEAD}
list=${WHEEL_LIST:-$here/../shared/gpu/wheels-vllm-0.26.0-device.txt}
[ -f "$list" ] || list=/work/shared/gpu/wheels-vllm-0.26.0-device.txt
mkdir -p "$dest/whl" "$dest/parts"
platforms=""
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux1_x86_64 manylinux_2_24_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 \
         manylinux_2_35_x86_64 any; do platforms="$platforms --platform $p"; done
grep -v '^#' "$list" > "$dest/wheels.txt"
# specrig's own needs (pyproject.toml) that the device image lacks: it has rich, pyyaml, cryptography's
# cffi comes with the list; versions as on the laptop that tested this.
cat >> "$dest/wheels.txt" <<'REQ'
fabric==3.2.3
invoke==2.2.1
paramiko==5.1.0
bcrypt==5.0.0
pynacl==1.6.2
decorator==5.2.1
deprecated==1.3.1
REQ
# py-spy: the profile of an arm's processes, where the device lets it attach (benchmarks/gpu/profiling.py).
echo "py-spy==0.4.3" >> "$dest/wheels.txt"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    $platforms -d "$dest/whl" -r "$dest/wheels.txt"
n=$(ls "$dest/whl"/*.whl | wc -l)
echo "wheels: $n ($(du -sh "$dest/whl" | cut -f1))"
rm -f "$dest/parts"/p*
tar -C "$dest" -cf - whl | split -b 58M -d - "$dest/parts/p"
ls -la "$dest/parts"
rm -rf "$dest/tree" && mkdir -p "$dest/tree"
git -C "$here" archive "$rev" | tar -x -C "$dest/tree"
git -C "$here" rev-parse "$rev" > "$dest/tree/COMMIT"
echo "tree: $(cat "$dest/tree/COMMIT") ($(du -sh "$dest/tree" | cut -f1))"
