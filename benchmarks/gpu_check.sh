#!/usr/bin/env bash
# The whole GPU check of the CUDA backend, in one command on a machine with 2 CUDA GPUs:
# environment fingerprint, the conformance suite and the CUDA/Triton tests, `hal collectives` on
# 2 GPUs, the kernel benchmark and the collective benchmark. Everything lands under $OUT (default
# ./out) as 7 files: gpu_check.log (all output, benchmark tables included), env.json, pytest.log,
# hal_collectives.json, bench_kernels.json, bench_collectives.json and cuda_manifest.json (the capability
# manifest generated from the live CUDA dispatcher of this torch build).
#
# Usage, from the project root:  [HAL_COMMIT=<sha>] benchmarks/gpu_check.sh
# Wheels the machine lacks (stevedore) are installed from .whl/ when present
# (../shared/device/prepare-wheels.sh downloads them). Each step has its own time limit so a hang
# cannot eat the others' time; a failing step does not stop the rest, and the exit status is the
# number of failed steps.
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python3}
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
failed=0
step() { echo; echo "=== $1 ($(date -u +%H:%M:%S))"; }
check() { local rc=$1 what=$2; if [ "$rc" -ne 0 ]; then echo "!!! $what failed (exit $rc)"; failed=$((failed + 1)); fi; }

step "install"
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
$PY -m pip install -q --no-deps --no-build-isolation -e . ; check $? "pip install -e ."

step "fingerprint"
HAL_COMMIT=${HAL_COMMIT:-unknown} $PY - <<'PY' > "$OUT/env.json"
import json, os, platform, subprocess
import torch
def sh(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
import hal
info = {i.name: {"available": i.available, "reason": i.reason} for i in hal.list_backends()}
cuda = hal.get_backend("cuda")
print(json.dumps({
    "commit": os.environ.get("HAL_COMMIT"), "python": platform.python_version(), "machine": platform.machine(),
    "gpus": sh("nvidia-smi", "--query-gpu=index,name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"),
    "topology": sh("nvidia-smi", "topo", "-m"),
    "versions": cuda.versions(), "devices": [d.as_dict() for d in cuda.devices()], "backends": info,
    "kernels": (cuda.register_ops(__import__("hal.ops", fromlist=["x"]).REGISTRY), cuda.kernel_status)[1],
    "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                           "NVSHMEM_DISABLE_NVLS", "TORCH_NCCL_ASYNC_ERROR_HANDLING")},
}, indent=1, default=str))
PY
check $? "fingerprint"
cat "$OUT/env.json"

step "pytest: conformance (cuda) + CUDA backend + Triton kernels"
XDIST=""; $PY -c "import xdist" 2>/dev/null && XDIST="-n 8"
HAL_CONFORMANCE_BACKENDS=cuda timeout 200 $PY -m pytest -q -rs $XDIST -p no:cacheprovider \
  tests/test_conformance.py tests/test_cuda*.py tests/test_triton*.py 2>&1 | tee "$OUT/pytest.log"
check "${PIPESTATUS[0]}" "pytest"

step "hal collectives --device cuda --world-size 2"
timeout 100 $PY -m hal.cli.main collectives --device cuda --world-size 2 --format json > "$OUT/hal_collectives.json"
check $? "hal collectives"
$PY -c "import json,sys; d=json.load(open(sys.argv[1])); print('passed:', d['passed'], len(d['rows']), 'rows', sum(r['status']=='fail' for r in d['rows']), 'failed')" "$OUT/hal_collectives.json"

step "bench_kernels"
timeout 200 $PY benchmarks/bench_kernels.py --sweep --json "$OUT/bench_kernels.json"
check $? "bench_kernels"

step "bench_collectives (torchrun, 2 GPUs)"
timeout 120 $PY -m torch.distributed.run --standalone --nproc_per_node 2 benchmarks/bench_collectives.py \
  --sizes-mib 16,64,256,1024,4096 --blocking-wait --json "$OUT/bench_collectives.json"
check $? "bench_collectives"

step "capability manifest from the live CUDA dispatcher"
timeout 90 $PY -m hal.capabilities.generate cuda --out "$OUT/cuda_manifest.json"
check $? "manifest"

step "done: $failed step(s) failed"
exit "$failed"
