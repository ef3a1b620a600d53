#!/usr/bin/env bash
# The GPU check, one command on a machine with an NVIDIA GPU (results in $OUT, else ./gpu-results):
#
#     bash bench/gpu_check.sh
#
# It builds ortlite's extension for the machine's python3 (which must have torch with CUDA),
# installs onnxruntime-gpu from wheels carried in .whl/ if the machine's onnxruntime has no
# CUDA provider, runs the CUDA tests (pytest -m cuda) and bench/overhead.py --device cuda.
# Budget: under 9 minutes on an H200 (tests up to 3.5 min, benchmarks up to 2 min each, build ~20 s).
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
# ONNX Runtime's CUDA provider dlopens libcublas, libcudart, libcurand and libcudnn by soname:
# point it at the nvidia-* pip packages that torch's CUDA wheels install
nvidia_libs=$($PY -c "
import glob, os, site
dirs = {os.path.dirname(f) for sp in site.getsitepackages() for f in glob.glob(os.path.join(sp, 'nvidia', '**', 'lib*.so*'), recursive=True)}
print(':'.join(sorted(dirs)))" 2>/dev/null)
[ -n "$nvidia_libs" ] && export LD_LIBRARY_PATH=$nvidia_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
has_cuda_provider || log "no onnxruntime with a CUDA provider here: the CUDA tests will skip (see bench/fetch_gpu_wheels.sh)"
$PY -c "import onnxruntime, torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available(), '| onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers())" 2>&1 | tee -a "$RESULTS/summary.txt"

if ! $PY setup.py -q build_ext --inplace >"$RESULTS/build.txt" 2>&1; then
    log "building ortlite/_fast.pyx failed (see build.txt)"
    tail -n 20 "$RESULTS/build.txt"
    exit 1
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

# a CUDA session made directly: if the provider cannot load, ONNX Runtime says why here
timeout 60 $PY - <<'EOF' 2>&1 | tail -n 5 | tee -a "$RESULTS/summary.txt"
import torch, onnx, onnxruntime as ort
from onnx import helper, TensorProto
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
session = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
print("smoke session providers:", session.get_providers())
EOF
timeout 210 $PY -m pytest -q -rs -m cuda tests/test_cuda.py tests/test_frozen_weights.py >"$RESULTS/cuda-tests.txt" 2>&1
log "CUDA tests: exit $? ($(tail -n 1 "$RESULTS/cuda-tests.txt"))"
timeout 110 $PY bench/overhead.py --device cuda --no-inductor --rounds 7 --iters 500 --json "$RESULTS/overhead-cuda.json" >"$RESULTS/overhead-cuda.txt" 2>&1
log "overhead benchmark: exit $?"
tail -n 16 "$RESULTS/overhead-cuda.txt"
timeout 140 $PY bench/models.py --device cuda --models bert,llama,resnet,mobilenet --rounds 5 --iters 10 --no-dynamic --no-inductor \
    --json "$RESULTS/models-cuda.json" >"$RESULTS/models-cuda.txt" 2>&1
log "model benchmark: exit $?"
tail -n 30 "$RESULTS/models-cuda.txt"
