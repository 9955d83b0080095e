#!/usr/bin/env bash
# On the device: install the staged wheels once (into $SG/site), set the environment vLLM 0.26.0 needs
# there, and run the phases of device_run.py. Run from the repository root of the call:
#     bash .gpu/tree/benchmarks/gpu/device.sh prep extract ...
# The wheel parts must be in $SG/parts (benchmarks/gpu/stage.sh, one call per part).
set -uo pipefail
export SG=${SG:-/var/tmp/sg}
tree=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$SG" "${OUT:=$SG/out-copy}"
if [ ! -f "$SG/site/.installed" ]; then
    t=$(date +%s)
    ls -la "$SG/parts" || exit 3
    cat "$SG"/parts/p* | tar -x -C "$SG" || exit 3
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SG/site" "$SG"/whl/*.whl || exit 3
    rm -rf "$SG/whl"
    touch "$SG/site/.installed"
    echo "installed $(ls "$SG/site" | wc -l) entries in $(( $(date +%s) - t )) s"
fi
export PYTHONPATH=$SG/site${PYTHONPATH:+:$PYTHONPATH}
export PATH=$SG/site/bin:$PATH
# A tmpfs for the arms that take the disk out of the measurement (device_run.py's RAM): one of its own
# where the machine lets root mount it, else a directory in /dev/shm.
if [ -z "${RAM:-}" ]; then
    RAM=/var/tmp/ram
    mkdir -p "$RAM"
    mountpoint -q "$RAM" || mount -t tmpfs -o size=64g tmpfs "$RAM" 2>/dev/null || RAM=/dev/shm/sg
fi
export RAM
mkdir -p "$RAM" && df -h "$RAM" | tail -1
# vLLM's sampler imports flashinfer unless told not to; flashinfer is left out of the wheels (issue 19).
export VLLM_USE_FLASHINFER_SAMPLER=0
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Ended by timeout before the call's own limit, so that the results and the extras still come back
# (what it leaves running, in sessions of its own, the next call's `clean` phase stops).
cd "$tree" && timeout "${BUDGET_S:-540}" python3 benchmarks/gpu/device_run.py "$@"
rc=$?
cp "$SG/results.json" "$OUT/results.json" 2>/dev/null
tar -czf "$OUT/extras.tgz" -C "$SG" extras 2>/dev/null
echo "device_run exit $rc; $(du -sh "$OUT/extras.tgz" 2>/dev/null | cut -f1) of extras; disk: $(df -h "$SG" | tail -1)"
exit $rc
