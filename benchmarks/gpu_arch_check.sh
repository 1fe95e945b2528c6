#!/usr/bin/env bash
# GPU check of the backend architecture (issue 21), on a machine with >= 1 CUDA GPU, system python3
# with a CUDA torch, CuPy and Triton. Writes $OUT/gpu_arch_check.log (all output) and one JUnit XML
# per pytest step; the exit status is the number of failed steps.
#   1. the conformance suite (+ the CUDA backend's and TorchDeviceBackend's tests) on cuda;
#   2. the same with CuPy hidden (a PYTHONPATH folder whose `cupy` raises ImportError): cuda must be
#      available, the CuPy pool/interop reported unavailable with the reason;
#   3. CuPy and Triton hidden: cuda available, Triton kernels unavailable with the reason, torch's
#      kernels registered instead;
#   4. the 50-line example backend (examples/backend_in_50_lines.py) registered in process and run
#      through the whole conformance suite.
# Usage, from the project root:  ../shared/device/prepare-wheels.sh; benchmarks/gpu_arch_check.sh
# Site setting, not a library default: NVLink multicast is unusable on the shared H200 hosts.
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python3}
exec > >(tee -a "$OUT/gpu_arch_check.log") 2>&1
failed=0
step() { echo; echo "=== $1 ($(date -u +%H:%M:%S))"; }
check() { local rc=$1 what=$2; if [ "$rc" -ne 0 ]; then echo "!!! $what failed (exit $rc)"; failed=$((failed + 1)); else echo "--- $what ok"; fi; }
PYTEST=(timeout 900 "$PY" -m pytest -q -p no:cacheprovider -rs)
SUITE=(tests/test_conformance.py tests/test_cuda_backend.py tests/test_device_backend.py)

step "install"
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
$PY -m pip install -q --no-deps --no-build-isolation -e . ; check $? "pip install -e ."
nvidia-smi -L; git rev-parse HEAD 2>/dev/null
$PY -c "import torch, cupy, triton; print('torch', torch.__version__, 'cupy', cupy.__version__, 'triton', triton.__version__)"

step "1. conformance on cuda (CuPy and Triton present)"
HAL_CONFORMANCE_BACKENDS=cuda "${PYTEST[@]}" "${SUITE[@]}" --junitxml="$OUT/1_cuda.xml"; check $? "conformance on cuda"

HIDE=$(mktemp -d)
mkdir -p "$HIDE/nocupy/cupy" "$HIDE/nothing/cupy" "$HIDE/nothing/triton"
for d in "$HIDE/nocupy/cupy" "$HIDE/nothing/cupy" "$HIDE/nothing/triton"; do
  echo "raise ImportError('hidden by gpu_arch_check.sh: $(basename "$d") is not installed here')" > "$d/__init__.py"
done
PROBE='
import os, sys, hal
from hal.backends.cuda import CudaBackend
info = {i.name: i for i in hal.list_backends()}["cuda"]
print("cuda available:", info.available, "|", info.reason)
extras = CudaBackend.extras()
for k, a in extras.items():
    print(f"  {k}: available={a.available} ({a.reason})")
b = hal.get_backend("cuda")
import hal.ops, torch
x = torch.randn(64, 128, device="cuda")
torch.testing.assert_close(hal.ops.softmax(x, -1), torch.softmax(x, -1))
print("kernels:", b.kernel_status)
want_missing = sys.argv[1].split(",")
assert info.available, "cuda must be available without " + sys.argv[1]
for k in want_missing:
    assert not extras[k].available and "is not importable" in extras[k].reason, (k, extras[k])
if "triton_kernels" in want_missing:
    assert b.kernel_status.startswith("torch kernels only: triton kernels unavailable"), b.kernel_status
print("OK: cuda available,", ", ".join(want_missing), "unavailable with the reason")
'

step "2. CuPy hidden"
PYTHONPATH="$HIDE/nocupy${PYTHONPATH:+:$PYTHONPATH}" $PY -c "$PROBE" cupy_pool_interop; check $? "probe with cupy hidden"
PYTHONPATH="$HIDE/nocupy${PYTHONPATH:+:$PYTHONPATH}" HAL_CONFORMANCE_BACKENDS=cuda "${PYTEST[@]}" \
  tests/test_conformance.py tests/test_device_backend.py --junitxml="$OUT/2_cuda_nocupy.xml"; check $? "conformance on cuda, cupy hidden"

step "3. CuPy and Triton hidden"
PYTHONPATH="$HIDE/nothing${PYTHONPATH:+:$PYTHONPATH}" $PY -c "$PROBE" cupy_pool_interop,triton_kernels; check $? "probe with cupy+triton hidden"
PYTHONPATH="$HIDE/nothing${PYTHONPATH:+:$PYTHONPATH}" HAL_CONFORMANCE_BACKENDS=cuda "${PYTEST[@]}" \
  tests/test_conformance.py --junitxml="$OUT/3_cuda_nothing.xml"; check $? "conformance on cuda, cupy+triton hidden"

step "4. the 50-line example backend through the conformance suite"
timeout 900 $PY examples/backend_in_50_lines.py cuda -rs --junitxml="$OUT/4_example.xml"; check $? "example backend"

step "done: $failed failed step(s)"
exit "$failed"
