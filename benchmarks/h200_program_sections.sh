#!/usr/bin/env bash
# Issue 17 on the GPU, in one command: the precision tests that need CUDA (shadows and statistics on the
# device), hal-audit --precision --profile on a plain CUDA training script (autocast fp16 + GradScaler,
# TransformerEncoder: tests/fixtures/precision/cuda_autocast_train.py, no code change), the overhead
# benchmark of both sections on that script, and the profiler-activity breakdown.
#
# Usage, from the project root on the H200 host:  OUT=/some/dir bash benchmarks/h200_program_sections.sh
# Writes $OUT/audit-cuda-autocast-script.tgz (the audit folder: audit.json, audit.md, audit.html, audit.sarif,
# trace.json, stdout.txt, exit_code.txt, env.json, gpus.csv; unpack it under reports/h200/),
# $OUT/audit-cuda-fixtures.tgz (one audit folder per fixture), $OUT/precision-cuda-cnn.{json,md},
# $OUT/attention-tolerance-cuda.json, $OUT/bench_program_sections_cuda.json, $OUT/bench_program_sections_profile_cuda.json,
# $OUT/bench_precision_cuda_{tiny,gpt2small}.json, $OUT/bench_profiler_configs_cuda.json and
# $OUT/h200_program_sections.log. Carried wheels in .whl/ are installed first: the image lacks stevedore and
# jsonschema (carry ../shared/device/prepare-wheels.sh stevedore==5.10.0 jsonschema==4.26.0
# jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 attrs==26.1.0 liger-kernel==0.8.5).
# H200_STEPS=tests,audit,fixtures,precision-cnn,attention,bench,profile-repeats,steady-tiny,steady-gpt2,profiler picks steps
# (default: all). The exit status is the number of failed steps.
set -u
OUT=${OUT:-$PWD/out}
D=$OUT/audit-cuda-autocast-script  # the device tool returns folders only a few levels deep
mkdir -p "$D"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/h200_program_sections.log") 2>&1
. "$(dirname "$0")/h200_steps.sh"

step install
install_project
$PY -c "import json, hal.environment as e; print(json.dumps(e.fingerprint(), indent=1, default=str))" > "$D/env.json"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$D/gpus.csv"

if want tests; then
  step "precision tests on CUDA (float64 shadows and batched statistics on the device; the CUDA smoke audits)"
  run 240 env HAL_REQUIRE_BACKENDS=cuda $PY -m pytest -q -rs -p no:cacheprovider -p no:randomly \
      tests/test_precision_batched.py tests/test_cuda_smoke.py tests/test_profile_attribution.py tests/test_tf32.py
fi

if want audit; then
  step "hal-audit --precision --profile on the CUDA autocast script"
  timeout 300 $PY -m hal.cli.audit tests/fixtures/precision/cuda_autocast_train.py --device cuda --precision --profile \
    --steps 3 --timeout 240 --out "$D" --format text -- --iters 50 > "$D/stdout.txt" 2>&1
  echo $? > "$D/exit_code.txt"
  tail -5 "$D/stdout.txt"
  $PY - "$D/audit.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
p, f, t = d.get("precision") or {}, d.get("profile") or {}, d.get("target") or {}
print("target verified:", t.get("verified"), "| precision verdict:", p.get("verdict"), "verified:", p.get("verified"),
      "first divergence:", p.get("first_divergence"))
print("precision timing:", (p.get("target") or {}).get("timing"))
print("profile verified:", f.get("verified"), "activities:", f.get("activities"), "step ms:", (f.get("step_ms") or {}).get("median"),
      "profiled:", (f.get("profiled_step_ms") or {}).get("median"), "ratio:", f.get("overhead_ratio"))
print("top ops (device ms):", [(o["op"], o["device_ms"]) for o in (f.get("ops") or [])[:5]])
PY
fi

# the program patterns met in the corpus, audited on the GPU: sparse adjacency (gcn/gat), complex spectra (FNO),
# torch.func per-sample gradients; each audit folder goes into one archive
if want fixtures; then
  step "hal-audit --precision --profile on the sparse, complex and torch.func fixtures"
  for f in sparse_graph_train spectral_conv_train per_sample_grads; do
    F=$OUT/audit-cuda-fixtures/$f; mkdir -p "$F"
    timeout 200 $PY -m hal.cli.audit tests/fixtures/precision/$f.py --device cuda --precision --profile --steps 2 \
      --timeout 150 --out "$F" --format text > "$F/stdout.txt" 2>&1
    echo $? > "$F/exit_code.txt"; echo "$f: exit $(cat "$F/exit_code.txt")"; tail -4 "$F/stdout.txt"
  done
  tar czf "$OUT/audit-cuda-fixtures.tgz" -C "$OUT" audit-cuda-fixtures && rm -rf "$OUT/audit-cuda-fixtures"
fi

# the cnn model against float64 (its float32 convolutions run in TF32 on this GPU, PyTorch's default)
if want precision-cnn; then
  step "precision: the cnn model on cuda against float64"
  run 150 $PY -m hal.conformance.precision --model cnn --device cuda --steps 3 --calibrate-with cpu --checkpoint-to cpu \
      --out "$OUT/precision-cuda-cnn.json"
fi

if want attention; then
  step "the local rule on the device's fused attention backward (flash, efficient; bf16, fp16; flat to peaked)"
  run 120 $PY benchmarks/study_attention_tolerance.py --device cuda --json "$OUT/attention-tolerance-cuda.json"
fi

if want bench; then
  step "overhead of --precision (cold, warm, warm with CPU shadows) and --profile on the script"
  run 330 $PY benchmarks/bench_program_sections.py --device cuda --repeats 2 --out "$OUT/bench_program_sections_cuda.json"
fi

# steady-state cost of the shadowed step in one process (warmed up; float64 on the device vs on the CPU; the
# pass-through dispatch mode's floor): a host-bound step (gpt tiny) and a larger one (gpt2-small shapes)
if want steady-tiny; then
  step "steady-state shadowed step, gpt tiny (host-bound)"
  run 90 $PY benchmarks/bench_precision.py --device cuda --config tiny --repeats 5 --diagnose --out "$OUT/bench_precision_cuda_tiny.json"
fi
if want steady-gpt2; then
  step "steady-state shadowed step, gpt2-small shapes"
  run 200 $PY benchmarks/bench_precision.py --device cuda --config gpt2-small --batch-size 4 --seq-len 128 \
      --repeats 3 --diagnose --out "$OUT/bench_precision_cuda_gpt2small.json"
fi

if want profile-repeats; then
  step "the profile section's overhead ratio over more repeats (profile only, 5 timed steps each)"
  run 150 $PY benchmarks/bench_program_sections.py --device cuda --profile-only --repeats 6 --steps 5 \
      --out "$OUT/bench_program_sections_profile_cuda.json" -- --iters 40 --batch 8 --seq 64
fi

if want profiler; then
  step "torch.profiler activity sets on the script's training step"
  run 90 $PY benchmarks/bench_profiler_configs.py --device cuda --out "$OUT/bench_profiler_configs_cuda.json"
fi

step done
echo "failed steps: $failed"
# one archive of the audit folder (the device tool brings back a few files, not deep folders)
tar czf "$OUT/audit-cuda-autocast-script.tgz" -C "$OUT" audit-cuda-autocast-script && rm -rf "$D"
exit $failed
