#!/usr/bin/env bash
# Produce the committed CUDA reports on a machine with 2 CUDA GPUs (the H200 host), in one command:
# reference models on CUDA (train + infer, gpt2-small memory estimate against max_memory_allocated),
# 2-GPU data-parallel gpt2-small on NCCL with scaling figures, precision (cuda vs float64), profiles
# (gpt train and decode, roofline), the compatibility matrix's CUDA cells, hal-audit runs on CUDA,
# and the conformance suite for cuda. Results land in $OUT/h200-reports.tar.gz (reports/ layout),
# with the environment fingerprint of every step's machine in env.json.
#
# Usage, from the project root:  [HAL_COMMIT=<sha>] benchmarks/h200_reports.sh [PART ...]
# PARTs: models dp precision profile matrix audit tests (default: all). MATRIX_JOBS: matrix cells at once (4). Each step has its own time
# limit; a failing step does not stop the rest; the exit status is the number of failed steps.
set -u
OUT=${OUT:-$PWD/out}
R=$OUT/r
mkdir -p "$R"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python3}
exec > >(tee -a "$R/h200_reports.log") 2>&1
parts=${*:-models dp precision profile matrix audit tests}
want() { case " $parts " in *" $1 "*) return 0;; esac; return 1; }
. "$(dirname "$0")/h200_steps.sh"

step install
install_project
HAL=$(dirname "$(command -v $PY)")/hal; [ -x "$HAL" ] || HAL="$PY -m hal.cli.main"
$PY -c "import json, hal.environment as e; print(json.dumps(e.fingerprint(), indent=1, default=str))" > "$R/env.json"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader > "$R/gpus.csv" 2>&1

if want models; then
  step "models on cuda"
  for m in gpt cnn moe; do for mode in train infer; do
    run 90 $PY -m hal.models.run --model $m --device cuda --mode $mode --steps 10 --out "$R/models-cuda-$m-$mode.json"
  done; done
  run 120 $PY -m hal.models.run --model gpt --config gpt2-small --device cuda --mode train --steps 5 --out "$R/models-cuda-gpt2small-train.json"
  run 120 $PY -m hal.models.run --model gpt --config gpt2-small --device cuda --dtype bfloat16 --mode train --steps 5 --out "$R/models-cuda-gpt2small-train-bf16.json"
fi
if want dp; then
  step "data-parallel gpt2-small on 2 GPUs (NCCL)"
  run 240 $PY -m torch.distributed.run --standalone --nproc_per_node=2 -m hal.models.dp --model gpt --config gpt2-small \
      --device cuda --steps 10 --baseline --out "$R/dp-cuda-gpt2small-x2.json"
fi
if want precision; then
  step "precision: cuda against float64"
  for m in gpt cnn moe; do
    run 150 $PY -m hal.conformance.precision --model $m --device cuda --steps 3 --calibrate-with cpu --checkpoint-to cpu --out "$R/precision-cuda-$m.json"
  done
  run 150 $PY -m hal.conformance.precision --model gpt --device cuda --autocast bfloat16 --steps 3 --out "$R/precision-cuda-gpt-autocast-bf16.json"
fi
if want profile; then
  step "profiles: gpt train and decode on cuda"
  run 150 $PY -m hal.conformance.profiling --model gpt --config gpt2-small --device cuda --mode train --out "$R/profile-cuda-gpt2small-train"
  run 150 $PY -m hal.conformance.profiling --model gpt --config gpt2-small --device cuda --mode infer --out "$R/profile-cuda-gpt2small-infer"
fi
if want matrix; then
  step "compatibility matrix: cuda cells"
  # gpt, cnn, moe and the 19 transformers architectures (hf:*): carry the transformers 4.x wheels, e.g.
  # ../shared/device/prepare-wheels.sh transformers==4.57.6 huggingface-hub==0.36.2 tokenizers==0.22.2 safetensors==0.8.0 regex
  run 540 $HAL matrix --devices cuda --models all --modes train,infer --dtypes float32,bfloat16 --jobs "${MATRIX_JOBS:-4}" --timeout 150 --out "$R/matrix-cuda"
fi
if want audit; then
  step "hal-audit on cuda"
  run 120 $PY -m hal.cli.audit examples/cuda_train.py --device cuda --steps 3 --out "$R/audit-cuda-cuda_train" --format text
  run 200 $PY -m hal.cli.audit gpt --device cuda --precision --profile --out "$R/audit-cuda-gpt" --format text
fi
if want tests; then
  step "conformance suite + CUDA backend tests on cuda"
  run 240 env HAL_CONFORMANCE_BACKENDS=cuda $PY -m pytest -q -rs -p no:cacheprovider tests/test_conformance.py tests/test_cuda_backend.py
fi
step "pack"
find "$R" -name trace.json -size +12M -exec gzip {} \;
tar czf "$OUT/h200-reports.tar.gz" -C "$OUT" r
ls -la "$OUT"
echo "failed steps: $failed"
exit $failed
