#!/usr/bin/env bash
# Profile of the real server at c=256 (128/128) on the H200, one device call (~3 minutes on the H200):
# artifact (7B-shaped, random bf16) -> server (engine in its process, the default) with a
# plain run, a py-spy run (all threads, idle included), a py-spy --gil run, a longer run
# -> the engine alone for the same loads. Prepared as run_gpu.sh (.whl with py-spy's wheel,
# .benchcarry/ctx/app re-rendered, .benchcarry/tok). Results under $OUT.
set -u -o pipefail
OUT=${OUT:-/tmp/profile-out}
BUDGET=${BUDGET:-380}
source bench/gpu_env.sh
SPY=${SPY:-$(command -v py-spy || echo /tmp/site/bin/py-spy)}
# The last commit's serving code (git archive HEAD), not uncommitted work in the tree:
[ -d .benchcarry/head ] && export BENCH_PACKAGES=$PWD/.benchcarry/head/mistral-trt-truss/packages
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv; nproc; $SPY --version; } 2>&1 | tee "$OUT/env.txt"
$PY bench/gpu_bench.py make-artifact "$ART" --tokenizer-from .benchcarry/tok ${TINY:+--tiny} \
  --out "$OUT/results.jsonl" 2>&1 | grep -v "it/s]"
timeout ${TLIM:-400} $PY bench/profile_server.py "$ART" .benchcarry/ctx/app --out "$OUT" \
  --pyspy "$SPY" --budget $BUDGET ${MBS:+--max-batch-size $MBS --concurrency $MBS} \
  ${LPW:+--long-per-worker $LPW} 2>&1 | grep -v "it/s]" | tee "$OUT/driver.log"
gzip -f "$OUT/server.log"; ls -la "$OUT"
