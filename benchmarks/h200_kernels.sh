#!/usr/bin/env bash
# Issue 23 on one H200, in one command (the steps' limits add up to 1310 s + install): GPU correctness
# tests of the Triton kernels and the fused linear + cross-entropy, the raw Triton-vs-torch sweep ->
# routing table, the eager kernel benchmark (hal / torch / Liger / torch.compile, fwd + bwd) routed by
# that table, gpt2-small bf16 training through hal.ops vs torch eager vs torch.compile, and the kernel
# tests' own timing report (wide-row norm backward, cross_entropy at 32000 classes, decode host time) and
# the norm backward plans' tuning table.
#
# Usage, from the project root:  OUT=/some/dir bash benchmarks/h200_kernels.sh
# Writes directly in $OUT: h200_kernels.log, env.json, routing.json, bench_kernels.json,
# e2e_gpt2small.json, kern_timing.json, tune_norm_bwd.json, host_path.json, tune_softmax_bwd.json, tune_lce.json, tune_silu_and_mul.json. Carried wheels in .whl/ (liger_kernel, jsonschema, stevedore,
# ...) are installed first when present. Each step has its own time limit; a failing step does not
# stop the rest; the exit status is the number of failed steps. H200_STEPS picks steps (comma-separated:
# tests,forced,host,sweep,bench,e2e,timing,dispatch,tune,tune-softmax,tune-lce,tune-silu; default all); without the sweep, the benchmarks route by
# the shipped table (backends/cuda/kernels/routing.json).
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
exec > >(tee -a "$OUT/h200_kernels.log") 2>&1
. "$(dirname "$0")/h200_steps.sh"

step install
install_project
$PY -c "import json, hal.environment as e; print(json.dumps(e.fingerprint(), indent=1, default=str))" > "$OUT/env.json"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
$PY -c "import liger_kernel.transformers.functional; print('liger ok')" || echo "liger_kernel not importable: liger_us will be null"

if want tests; then
step "GPU tests (kernels forced by their module; the fused head; the backend)"
# HAL_TRITON_LAUNCH=check: every direct launch is checked against the kernel Triton would have run
run 240 env HAL_REQUIRE_BACKENDS=cuda HAL_TRITON_LAUNCH=check $PY -m pytest -q -rs -n 8 -p no:cacheprovider \
    -p no:randomly tests/test_triton_launch.py tests/test_triton_kernels.py tests/test_kernel_routing.py \
    tests/test_linear_cross_entropy.py tests/test_cuda_backend.py tests/test_ops.py
fi
if want forced; then
step "the backend's training step with every call on the kernels (HAL_CUDA_ROUTING=triton)"
run 30 env HAL_CUDA_ROUTING=triton $PY -m pytest -q -rs -p no:cacheprovider -p no:randomly tests/test_cuda_backend.py \
    -k "training_step or routes_to_triton"
fi

if want host; then
step "host time per call of each layer of the kernel path, direct launch and Triton's side by side"
run 150 $PY benchmarks/bench_host_path.py --via bound,triton --profile --json "$OUT/host_path.json"
fi

ROUTING=backends/cuda/kernels/routing.json
if want sweep; then
step "raw Triton sweep -> routing table"
run 240 $PY benchmarks/bench_kernels.py --raw-triton --sweeps 3 --json "$OUT/routing.json" && ROUTING=$OUT/routing.json
fi

if want dispatch; then
step "host cost of hal.ops over torch, through the kernel wrappers routed to torch (routing: $ROUTING)"
run 90 env HAL_CUDA_ROUTING="$ROUTING" $PY benchmarks/bench_dispatch.py --device cuda --out "$OUT/bench_dispatch_cuda.json"
fi

if want bench; then
step "eager kernel benchmark (routing: $ROUTING)"
# the JSON is rewritten after every kernel: a time limit loses the kernels not reached (issue 23's first)
run 140 env HAL_CUDA_ROUTING="$ROUTING" $PY benchmarks/bench_kernels.py --eager --compile-budget-s 30 \
    --kernels layer_norm,rms_norm,linear_cross_entropy,cross_entropy,softmax,log_softmax,add_rms_norm,silu_and_mul \
    --json "$OUT/bench_kernels.json"
fi

if want e2e; then
step "gpt2-small bf16 training: hal vs torch vs torch.compile"
run 180 env HAL_CUDA_ROUTING="$ROUTING" $PY benchmarks/bench_e2e.py --config gpt2-small --dtype bfloat16 \
    --steps 12 --warmup 3 --vocab64 --breakdown --json "$OUT/e2e_gpt2small.json"
fi

if want timing; then
step "wide-row norm backward, cross_entropy 32000, decode host time (tests/test_triton_kernels.py's report)"
run 40 $PY tests/test_triton_kernels.py "$OUT/kern_timing.json"
fi

if want tune-softmax; then
step "softmax backward plans: single pass (warps) against two passes, torch and Liger (benchmarks/tune_softmax_bwd.py)"
run 120 $PY benchmarks/tune_softmax_bwd.py --json "$OUT/tune_softmax_bwd.json"
fi

if want tune-lce; then
step "fused linear + cross-entropy: vocabulary padded or not, per row count, beside torch (benchmarks/tune_lce.py)"
run 240 $PY benchmarks/tune_lce.py --json "$OUT/tune_lce.json"
fi

if want tune-silu; then
step "silu_and_mul launch plans (block, warps), forward and backward, beside torch and Liger (benchmarks/tune_silu_and_mul.py)"
run 200 $PY benchmarks/tune_silu_and_mul.py --json "$OUT/tune_silu_and_mul.json"
fi

if want tune; then
step "norm backward plans: every plan's GPU time per width (benchmarks/tune_norm_bwd.py)"
run 150 $PY benchmarks/tune_norm_bwd.py --json "$OUT/tune_norm_bwd.json"
fi

step done
ls -la "$OUT"
echo "failed steps: $failed"
exit $failed
