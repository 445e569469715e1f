#!/usr/bin/env bash
# Server vs engine and the server's cold start, in one device call (H200, ~6 minutes):
#   artifact (7B-shaped, random bf16) + build manifest -> hash check (writes the marker)
#   -> in-process engine (cold disk read rate, cold load, 128/128 and 1024/256 sweeps)
#   -> the real server (defaults: uvloop, httptools, engine in the server's process) started
#      with the whole page cache dropped (cold start), same sweeps, its GC pauses
#   -> the same server with http_parser=h11 at 128/128 (the parser's share; SKIP_H11=1: not)
# Prepared as for run_gpu.sh (docs/performance.md: .whl/, .benchcarry/ctx/app, .benchcarry/tok).
# Usage (device tool): bash bench/run_gpu_server.sh   (results under $OUT)
set -u -o pipefail
BUDGET=${BUDGET:-420}
source bench/gpu_env.sh
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; free -g | head -2
  df -h /tmp | tail -1; $PY -c 'import torch, uvloop, httptools; print("torch", torch.__version__)'
} 2>&1 | tee "$OUT/env.txt"

$B make-artifact "$ART" --tokenizer-from .benchcarry/tok ${TINY:+--tiny} --out "$R" 2>&1 | grep -v "it/s]" | tee "$L/artifact.log"
$B prepare-verify "$ART" --verify "$CACHE" ${DROP---drop-page-cache} --out "$R" 2>&1 | tee -a "$L/artifact.log"
timeout $(left 52) $B engine "$ART" ${DROP---drop-page-cache} ${DISK---disk-test} ${QUICK:+--quick} \
  --skip-variants ${LONG---long} ${MBS:+--max-batch-size $MBS} --deadline $(at 50) --out "$R" \
  2>&1 | grep -v "it/s]" | tee "$L/engine.log"; snap
timeout $(left 85) $B service "$ART" .benchcarry/ctx/app ${DROP---drop-page-cache} \
  ${MBS:+--max-batch-size $MBS} ${LEVELS:+--concurrency $LEVELS} --verify "$CACHE" ${LONG---long} \
  --deadline $(( $(at 85) - 10 )) --log "$L/server.log" --out "$R" 2>&1 | tee "$L/service.log"
grep -ah "frozen\|page cache\|hashes verified\|loaded\|KV cache" "$L/server.log" | cut -c1-300 | tail -8; snap
[ -n "${SKIP_H11:-}" ] || timeout $(left 100) $B service "$ART" .benchcarry/ctx/app ${MBS:+--max-batch-size $MBS} \
  --concurrency ${H11_LEVELS:-256} --set http_parser=h11 --deadline $(( $(at 100) - 5 )) \
  --log "$L/server-h11.log" --out "$R" 2>&1 | tee "$L/service-h11.log"
snap; echo "total $(( $(date +%s) - START )) s"
