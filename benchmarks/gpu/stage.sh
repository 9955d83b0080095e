#!/usr/bin/env bash
# On the device, one call per part (a call carries 64 MiB at most): copy the carried part to $SG/parts,
# where it stays while the machine is held.  device run: carry [".gpu/parts/p00"],
#     command: bash .gpu/tree/benchmarks/gpu/stage.sh p00     (carry .gpu/tree too, or paste the lines)
set -eu
SG=${SG:-/var/tmp/sg}
mkdir -p "$SG/parts"
cp ".gpu/parts/$1" "$SG/parts/$1"
ls -la "$SG/parts"
