#!/usr/bin/env bash
# On the device, one call per part (a call carries 64 MiB at most): copy the carried part to $SG/parts,
# where it stays while the machine is held.  device run: carry [".gpu/parts/p00", ".gpu/tree"],
#     command: bash .gpu/tree/benchmarks/gpu/stage.sh p00 [build]
# `build` also starts building the model and the data in the background (a session of its own, so it
# outlives the call while the machine is held; it needs only the image's torch, transformers and
# tokenizers): device_run.py's prep phase waits for it.
set -eu
SG=${SG:-/var/tmp/sg}
SHAPE=${SHAPE:-llama8b}
mkdir -p "$SG/parts" "$SG/models" "$SG/data"
cp ".gpu/parts/$1" "$SG/parts/$1"
ls -la "$SG/parts"
if [ "${2:-}" = build ] && [ ! -e "$SG/models/$SHAPE.building" ]; then
    tools=$(cd "$(dirname "$0")" && pwd)/gpu_tools.py
    # Copied out of the call's tree, which the next call replaces; the tokenizer recipe beside it (the
    # lab's own, which gpu_tools imports: a script's own directory is first on its sys.path).
    cp "$tools" "$SG/gpu_tools.py"
    cp "$(dirname "$tools")/../../specrig/lab/make_tiny_model.py" "$SG/make_tiny_model.py"
    touch "$SG/models/$SHAPE.building"
    setsid nohup bash -c "python3 '$SG/gpu_tools.py' build-model '$SG/models/$SHAPE' '$SHAPE' '$SG/data/chat-$SHAPE.jsonl' \
        '${N_DATA:-1024}' > '$SG/models/$SHAPE.log' 2>&1 && tail -1 '$SG/models/$SHAPE.log' > '$SG/models/$SHAPE.done'" \
        < /dev/null > /dev/null 2>&1 &
    echo "building $SHAPE in the background"
    nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv
fi
