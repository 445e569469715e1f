#!/usr/bin/env bash
# The server's cold start, in one device call (H200, ~4 minutes): artifact (7B-shaped,
# random bf16) + build manifest -> hash check (writes the verified marker) -> where a fresh
# interpreter's seconds go (cold_start.py, everything evicted) -> the real server started
# with the whole page cache dropped (start -> ready only; the server log's phase lines are
# printed).
# Prepared as for run_gpu.sh (docs/performance.md: .whl/, .benchcarry/ctx/app, .benchcarry/tok).
# Usage (device tool): bash bench/run_gpu_start.sh   (results under $OUT)
set -u -o pipefail
source bench/gpu_env.sh

$B make-artifact "$ART" --tokenizer-from .benchcarry/tok ${TINY:+--tiny} --out "$R" 2>&1 | grep -v "it/s]"
$B prepare-verify "$ART" --verify "$CACHE" ${DROP---drop-page-cache} --out "$R"
[ -n "${SKIP_PHASES:-}" ] || $PY bench/cold_start.py "$ART" --evict ${DROP+artifact}${DROP-all} \
  ${MBS:+--max-batch-size $MBS} --out "$R"
$B service "$ART" .benchcarry/ctx/app ${DROP---drop-page-cache} --start-only ${MBS:+--max-batch-size $MBS} \
  --verify "$CACHE" --log "$L/server-start.log" --out "$R"
grep -ah "Started server\|page cache\|weights:\|loaded /" "$L/server-start.log" | cut -c1-200
tar czf "$OUT/logs.tgz" -C "$L" . 2>/dev/null; echo "total $(( $(date +%s) - START )) s"
