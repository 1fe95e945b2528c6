#!/usr/bin/env bash
# The WHOLE test suite on the GPU machine, with that machine's own CUDA torch, CuPy and Triton, and
# loud: HAL_REQUIRE_BACKENDS=cuda turns every skipped CUDA test (backend unusable, Triton missing)
# into a failure, so "all green" there means the CUDA tests really ran. The suite includes the op
# properties on cuda (tests/test_ops_properties.py, float64 oracle vs the Triton kernels), the Triton
# kernel tests, the conformance suite on cuda, and the hal-audit smoke tests on cuda with
# --precision and --profile (tests/test_cuda_smoke.py).
#
# Usage, from the project root:
#   here (CPU machine), once:  ../shared/device/prepare-wheels.sh     # stevedore -> .whl/ (the image lacks it)
#   on the H200 (carry .whl):  HAL_COMMIT=$(git rev-parse HEAD) bash benchmarks/gpu_suite.sh
# TESTS (default: tests) runs a part of the suite (paths, space-separated), for a part that fits one call's time limit;
# WORKERS (default 8) and DIST (default loadfile: a file's module fixtures run once) are pytest-xdist's -n and --dist.
# PART=k/n (1 <= k <= n) runs every n-th test file from the k-th, in C-locale sorted order, instead of TESTS: the
# suite in n calls (the whole suite on 16 workers did not fit one 600 s call); give each part its own OUT. The parts
# leave out LONG_FILES (test_program_precision_profile.py: 2788 s of tests on an H100, one worker's under loadfile),
# which PART=long runs with --dist load (262 s on 16 workers): PART=1/6 ... 6/6 and long are the whole suite.
# One H200 is enough; with two, the 2-device collectives conformance runs too (with one it skips
# as a machine-shape skip, which HAL_REQUIRE_BACKENDS leaves a skip).
#
# Writes $OUT (default reports/gpu-suite): suite.log (everything printed), env.json (commit, python,
# torch, CUDA, CuPy, Triton, driver, GPUs, hal backends), junit.xml and summary.json
# ({passed, failed, errors, skipped, cuda_skips, pytest_exit, skip_reasons, commit, tests: the part or paths run,
# seconds: pytest's wall time}). Exit status: pytest's (0 = green).
set -u
OUT=${OUT:-$PWD/reports/gpu-suite}
mkdir -p "$OUT"
: > "$OUT/suite.log"
exec > >(tee -a "$OUT/suite.log") 2>&1
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HAL_REQUIRE_BACKENDS=${HAL_REQUIRE_BACKENDS:-cuda} CI=true HYPOTHESIS_PROFILE=ci
PY=${PYTHON:-python3}
echo "=== gpu_suite $(date -u +%FT%TZ) commit=${HAL_COMMIT:-unknown} HAL_REQUIRE_BACKENDS=$HAL_REQUIRE_BACKENDS"

echo "=== install"
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
$PY -m pip install -q --no-deps --no-build-isolation -e . || { echo "!!! pip install -e . failed"; exit 2; }

echo "=== environment"
HAL_COMMIT=${HAL_COMMIT:-unknown} $PY - "$OUT/env.json" <<'PY'
import json, os, platform, subprocess, sys
import torch
def sh(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
def version(mod):
    try:
        return __import__(mod).__version__
    except Exception as exc:
        return f"not importable ({type(exc).__name__}: {exc})"
import hal
env = {"commit": os.environ.get("HAL_COMMIT"), "python": platform.python_version(), "executable": sys.executable,
       "platform": platform.platform(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
       "cuda_available": torch.cuda.is_available(), "device_count": torch.cuda.device_count(),
       "cupy": version("cupy"), "triton": version("triton"), "hypothesis": version("hypothesis"),
       "pytest": version("pytest"),
       "gpus": sh("nvidia-smi", "--query-gpu=index,name,driver_version,memory.total", "--format=csv,noheader"),
       "backends": {i.name: {"available": i.available, "reason": i.reason} for i in hal.list_backends()},
       "env": {k: os.environ.get(k) for k in ("HAL_REQUIRE_BACKENDS", "CI", "HYPOTHESIS_PROFILE", "NCCL_NVLS_ENABLE",
                                              "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")}}
json.dump(env, open(sys.argv[1], "w"), indent=1, default=str)
print(json.dumps(env, indent=1, default=str))
PY

# a file whose tests alone outlast a call on one worker: PART=k/n leaves it out, PART=long runs it over every worker
LONG_FILES="tests/test_program_precision_profile.py"
if [ "${PART:-}" = long ]; then
  TESTS=$LONG_FILES; DIST=load
elif [ -n "${PART:-}" ]; then
  k=${PART%/*}; n=${PART#*/}
  if ! [[ "$k" =~ ^[0-9]+$ && "$n" =~ ^[0-9]+$ ]] || (( k < 1 || k > n )); then
    echo "gpu_suite: PART must be k/n with 1 <= k <= n, or long, got '$PART'"; exit 2
  fi
  TESTS=$(find tests -maxdepth 1 -name 'test_*.py' | LC_ALL=C sort | grep -vxF "$LONG_FILES" \
          | awk -v k="$k" -v n="$n" '(NR - 1) % n == k - 1' | tr '\n' ' ')
fi
echo "=== pytest: ${PART:+part $PART of }${TESTS:-the whole suite}"
XDIST=""; $PY -c "import xdist" 2>/dev/null && XDIST="-n ${WORKERS:-8} --dist ${DIST:-loadfile}"
T0=$(date +%s)
# -p no:benchmark: the GPU image has pytest-benchmark, which prints a warning per xdist worker (no test uses it)
# shellcheck disable=SC2086  # TESTS: one or more paths, split on spaces
$PY -m pytest -q -rs $XDIST -p no:cacheprovider -p no:randomly -p no:benchmark --junitxml="$OUT/junit.xml" ${TESTS:-tests}
rc=$?
export GPU_SUITE_SECONDS=$(( $(date +%s) - T0 )) GPU_SUITE_TESTS="${PART:+part $PART: }${TESTS:-tests}"

echo "=== summary (pytest exit $rc)"
$PY - "$OUT/junit.xml" "$OUT/summary.json" "$rc" <<'PY'
import json, os, sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
reasons = {}
for case in root.iter("testcase"):
    kinds = {c.tag for c in case}
    if "failure" in kinds:
        counts["failed"] += 1
    elif "error" in kinds:
        counts["errors"] += 1
    elif "skipped" in kinds:
        counts["skipped"] += 1
        msg = next(c for c in case if c.tag == "skipped").get("message", "")
        reasons[msg] = reasons.get(msg, 0) + 1
    else:
        counts["passed"] += 1
cuda_skips = sum(n for m, n in reasons.items() if m.lower().removeprefix("skipped: ").startswith("cuda:"))
doc = dict(counts, cuda_skips=cuda_skips, pytest_exit=int(sys.argv[3]),
           skip_reasons=dict(sorted(reasons.items(), key=lambda kv: -kv[1])), commit=os.environ.get("HAL_COMMIT"),
           tests=os.environ["GPU_SUITE_TESTS"], seconds=int(os.environ["GPU_SUITE_SECONDS"]))
json.dump(doc, open(sys.argv[2], "w"), indent=1)
print(json.dumps(doc, indent=1))
PY
echo "=== done $(date -u +%FT%TZ): pytest exit $rc; files in $OUT"
exit "$rc"
