#!/usr/bin/env bash
# Saves the onnxruntime-gpu wheel for a GPU machine's Python (default 3.12) into .whl/, split
# into parts of at most 62 MiB for transfers capped at 64 MiB (bench/gpu_check.sh joins them).
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=${1:-3.12}
VERSION=${ORT_VERSION:-1.31.1}
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
mkdir -p .whl
python3 -m pip download --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    -d .whl "onnxruntime-gpu==$VERSION"
for wheel in .whl/onnxruntime_gpu-*.whl; do
    split -b 62M "$wheel" "$wheel.part-"
    rm "$wheel"
done
ls -la .whl
