#!/usr/bin/env bash
# The GPU figures of docs/performance.md in one device call (H200, ~7-9 minutes):
#   artifact (7B-shaped, random bf16) + build manifest -> hash check, first and later start
#   -> in-process engine (both loaders cold, sweeps, step GPU time, fp32 correctness check)
#   -> the real Truss server with engine_process=on, then off (cold start with hashes on,
#      token-id sweeps, text-prompt levels) -> `transformers serve --continuous-batching`.
# Prepared on the dev machine (see docs/performance.md):
#   .whl/                 wheels of the server's requirements the device image lacks
#   .benchcarry/ctx/app   the rendered Truss app dir (local_server.prepare_app_dir)
#   .benchcarry/tok/      the dev tokenizer files
# Usage (device tool): bash bench/run_gpu.sh   (results under $OUT)
set -u -o pipefail
BUDGET=${BUDGET:-540}            # seconds for the whole run
source bench/gpu_env.sh
gpu_mem() { nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>/dev/null | sed "s/^/$1: GPU memory used /" | tee -a "$OUT/env.txt"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
  nproc; free -g | head -2; df -h /tmp | tail -1
  $PY -c 'import torch, transformers, fastapi, uvicorn, openai, safetensors; print("torch", torch.__version__, "transformers", transformers.__version__, "fastapi", fastapi.__version__, "safetensors", safetensors.__version__)'
} 2>&1 | tee "$OUT/env.txt"

$B make-artifact "$ART" --tokenizer-from .benchcarry/tok ${TINY:+--tiny} --out "$R" 2>&1 | grep -v "it/s]" | tee "$L/artifact.log"
du -sh "$ART" | tee -a "$L/artifact.log"
$B prepare-verify "$ART" --verify "$CACHE" ${DROP---drop-page-cache} --out "$R" 2>&1 | tee -a "$L/artifact.log"

[ -n "${SKIP_ENGINE:-}" ] || timeout $(left 40) $B engine "$ART" ${DROP---drop-page-cache} \
  --skip-variants --compare-loaders --correctness ${LONG---long} ${MBS:+--max-batch-size $MBS} \
  --deadline $(at 34) --out "$R" 2>&1 | grep -v "it/s]" | tee "$L/engine.log"
gpu_mem "after engine"; snap
for EP in on off; do
  END=$([ $EP = on ] && echo 60 || echo 78)
  timeout $(left $END) $B service "$ART" .benchcarry/ctx/app ${DROP---drop-page-cache} \
    ${MBS:+--max-batch-size $MBS} ${LEVELS:+--concurrency $LEVELS} --set engine_process=$EP \
    --verify "$CACHE" ${LONG---long} $([ $EP = on ] && echo "--text-levels ${TEXT_LEVELS:-1 64 256}") \
    --deadline $(( $(at $END) - 15 )) --log "$L/server-$EP.log" --out "$R" 2>&1 | tee "$L/service-$EP.log"
  gpu_mem "after server engine_process=$EP"
  grep -ah "KV cache\|own process\|hashes verified\|loaded\|from_pretrained" "$L/server-$EP.log" | cut -c1-400 | tail -8; snap
done
[ -n "${SKIP_PEER:-}" ] || PYTHONPATH=${PEER_PYTHONPATH:-${PYTHONPATH:-}} timeout $(left 100) $B peer "$ART" \
  ${DROP---drop-page-cache} --text-levels ${TEXT_LEVELS:-1 64 256} --peer-flags="${PEER_FLAGS---cb-use-cuda-graph}" \
  --deadline $(( $(at 100) - 10 )) --log "$L/peer.log" --out "$R" 2>&1 | tee "$L/peer-bench.log"
snap; echo "total $(( $(date +%s) - START )) s"
