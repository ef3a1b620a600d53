#!/usr/bin/env bash
# The GPU check, one command on a machine with an NVIDIA GPU (results in $OUT, else ./gpu-results):
#
#     bash bench/gpu_check.sh
#
# It builds ortlite's extension for the machine's python3 (which must have torch with CUDA),
# installs onnxruntime-gpu from wheels carried in .whl/ if the machine's onnxruntime has no
# CUDA provider, runs the CUDA tests (pytest -m cuda) and bench/overhead.py --device cuda.
# Budget: well under 8 minutes on an H200 (tests ~1 min, benchmark ~2 min, build ~20 s).
#
# Carrying onnxruntime-gpu: `bash bench/fetch_gpu_wheels.sh` (here, with PyPI) saves the wheel
# for the machine's Python split into parts under .whl/. Where a transfer is capped (the device
# tool takes 64 MiB a call), carry some parts per call with `bash bench/gpu_check.sh --stage`:
# staged parts stay in /tmp/ortlite-wheels while the machine is up; the full run joins them.
set -uo pipefail
cd "$(dirname "$0")/.."
STAGE=/tmp/ortlite-wheels
mkdir -p "$STAGE"
cp .whl/* "$STAGE/" 2>/dev/null
if [ "${1:-}" = "--stage" ]; then
    ls -la "$STAGE"
    exit 0
fi

RESULTS=${OUT:-$PWD/gpu-results}
mkdir -p "$RESULTS"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
log() { echo "[gpu_check] $*" | tee -a "$RESULTS/summary.txt"; }
has_cuda_provider() {
    $PY -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" 2>/dev/null
}

nvidia-smi >"$RESULTS/nvidia-smi.txt" 2>&1 || log "nvidia-smi failed"
if ! has_cuda_provider; then
    for first in "$STAGE"/*.whl.part-aa; do
        [ -e "$first" ] && cat "${first%.part-aa}".part-* >"${first%.part-aa}"
    done
    wheel=$(ls "$STAGE"/onnxruntime_gpu-*.whl 2>/dev/null | head -n 1)
    if [ -n "$wheel" ]; then
        $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/ortlite-site "$wheel" \
            && export PYTHONPATH=/tmp/ortlite-site${PYTHONPATH:+:$PYTHONPATH}
    fi
fi
has_cuda_provider || log "no onnxruntime with a CUDA provider here: the CUDA tests will skip (see bench/fetch_gpu_wheels.sh)"
$PY -c "import onnxruntime, torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available(), '| onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers())" 2>&1 | tee -a "$RESULTS/summary.txt"

if ! $PY setup.py -q build_ext --inplace >"$RESULTS/build.txt" 2>&1; then
    log "building ortlite/_fast.pyx failed (see build.txt)"
    tail -n 20 "$RESULTS/build.txt"
    exit 1
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

timeout 300 $PY -m pytest -q -rs -m cuda tests/test_cuda.py tests/test_frozen_weights.py >"$RESULTS/cuda-tests.txt" 2>&1
log "CUDA tests: exit $? ($(tail -n 1 "$RESULTS/cuda-tests.txt"))"
timeout 240 $PY bench/overhead.py --device cuda --rounds 7 --iters 500 --json "$RESULTS/overhead-cuda.json" >"$RESULTS/overhead-cuda.txt" 2>&1
log "overhead benchmark: exit $?"
tail -n 16 "$RESULTS/overhead-cuda.txt"
