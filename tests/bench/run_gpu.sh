#!/usr/bin/env bash
# Issue 7's GPU figures in one device call (H200, ~7-9 minutes):
#   artifact (7B-shaped, random bf16) -> in-process engine bench -> the real Truss server.
# Prepared on the dev machine (see docs/performance.md):
#   .whl/           wheels of the Truss server's requirements the device image lacks
#   .benchcarry/ctx/app   the rendered Truss app dir (local_server.prepare_app_dir)
#   .benchcarry/tok/      the dev tokenizer files
# Usage (device tool): bash tests/bench/run_gpu.sh   (results under $OUT)
set -u -o pipefail
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
PY=${PY:-python3}
START=$(date +%s)
BUDGET=${BUDGET:-550}            # seconds for the whole run
ART=${ART:-/tmp/mistral-7b-random}
if [ -d .whl ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
  nproc; free -g | head -2; df -h /tmp | tail -1
  $PY -c 'import torch, transformers, fastapi, uvicorn, opentelemetry.sdk, pythonjsonlogger, msgpack_numpy; print("torch", torch.__version__, "transformers", transformers.__version__, "fastapi", fastapi.__version__)'
} 2>&1 | tee "$OUT/env.txt"

B="$PY tests/bench/gpu_bench.py"

$B make-artifact "$ART" --tokenizer-from .benchcarry/tok ${TINY:+--tiny} --out "$OUT/results.jsonl" 2>&1 | grep -v "it/s]" | tee "$OUT/artifact.log"
du -sh "$ART" | tee -a "$OUT/artifact.log"

# Engine phase gets until START + 60% of the budget; the service the rest.
[ -n "${SKIP_ENGINE:-}" ] || $B engine "$ART" ${DROP---drop-page-cache} ${QUICK:+--quick} ${ENGINE_FLAGS:-} ${MBS:+--max-batch-size $MBS} \
  --deadline $((START + BUDGET * 60 / 100)) --out "$OUT/results.jsonl" 2>&1 \
  | grep -v "it/s]" | tee "$OUT/engine.log"
$B service "$ART" .benchcarry/ctx/app ${DROP---drop-page-cache} ${QUICK:+--quick} ${MBS:+--max-batch-size $MBS} \
  ${LEVELS:+--concurrency $LEVELS} ${SERVICE_FLAGS:-} --deadline $((START + BUDGET)) --log "$OUT/server.log" \
  --out "$OUT/results.jsonl" 2>&1 | tee "$OUT/service.log"
if [ -n "${AB:-}" ]; then  # the same server at Python's default GIL switch interval
  $B service "$ART" .benchcarry/ctx/app ${DROP---drop-page-cache} --short --concurrency 64 256 \
    --set gil_switch_interval_ms=5 --deadline $((START + BUDGET + 40)) --log "$OUT/server-ab.log" \
    --out "$OUT/results.jsonl" 2>&1 | tee "$OUT/service-ab.log"
fi
echo "total $(( $(date +%s) - START )) s"
