#!/usr/bin/env bash
# Issue 17 on the GPU: hal-audit --precision --profile on a plain CUDA training script (autocast fp16 +
# GradScaler, TransformerEncoder: tests/fixtures/precision/cuda_autocast_train.py), no code change.
# Writes $OUT/reports/h200/audit-cuda-autocast-script/{audit.json,audit.md,audit.html,trace.json,stdout.txt,
# exit_code.txt} and $OUT/reports/h200/audit-cuda-autocast-script/env.json (environment fingerprint, nvidia-smi).
# Usage, from the project root on the H200 host:  OUT=/some/dir benchmarks/h200_program_sections.sh
# Then copy $OUT/reports/h200/audit-cuda-autocast-script into reports/h200/ and commit.
set -u
OUT=${OUT:-$PWD/out}
D=$OUT/reports/h200/audit-cuda-autocast-script
mkdir -p "$D"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
$PY -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "editable install failed: using PYTHONPATH"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
$PY -c "import json, hal.environment as e; print(json.dumps(e.fingerprint(), indent=1, default=str))" > "$D/env.json" 2>&1
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader > "$D/gpus.csv" 2>&1
timeout 900 $PY -m hal.cli.audit tests/fixtures/precision/cuda_autocast_train.py --device cuda --precision --profile \
  --steps 3 --timeout 600 --out "$D" --format text -- --iters 50 > "$D/stdout.txt" 2>&1
echo $? > "$D/exit_code.txt"
tail -5 "$D/stdout.txt"
$PY - "$D/audit.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
p, f, t = d.get("precision") or {}, d.get("profile") or {}, d.get("target") or {}
print("target verified:", t.get("verified"), "| precision verdict:", p.get("verdict"), "verified:", p.get("verified"),
      "first divergence:", p.get("first_divergence"))
print("profile verified:", f.get("verified"), "activities:", f.get("activities"), "step ms:", (f.get("step_ms") or {}).get("median"),
      "profiled:", (f.get("profiled_step_ms") or {}).get("median"), "ratio:", f.get("overhead_ratio"))
print("top ops (device ms):", [(o["op"], o["device_ms"]) for o in (f.get("ops") or [])[:5]])
PY
