#!/usr/bin/env bash
# Cold start, phase by phase, and the sweeps the main run leaves out (one device call,
# ~5 minutes): artifact -> cold_start.py with everything evicted, then only the artifact
# -> the server (engine_process off, then on) started with only the artifact evicted
# -> the in-process engine at 128/128 and 1024/256. Same preparation as run_gpu.sh.
set -u -o pipefail
BUDGET=${BUDGET:-330}
source bench/gpu_env.sh

$B make-artifact "$ART" --tokenizer-from .benchcarry/tok ${TINY:+--tiny} --out "$R" 2>&1 | grep -v "it/s]"
for EV in ${EVICT:-all artifact}; do $PY bench/cold_start.py "$ART" --evict $EV ${MBS:+--max-batch-size $MBS} --out "$R"; done
for EP in off on; do
  timeout $(left 60) $B service "$ART" .benchcarry/ctx/app --evict-artifact ${MBS:+--max-batch-size $MBS} \
    --set engine_process=$EP --concurrency 1 $([ $EP = off ] && echo "--text-levels ${TEXT_LEVELS:-1 64 256}") \
    --deadline $(at 60) --log "$L/server-$EP.log" --out "$R" 2>&1 | grep -av '"asctime"'
  snap
done
timeout $(left 100) $B engine "$ART" --evict-artifact --skip-variants --long ${QUICK:+--quick} \
  ${MBS:+--max-batch-size $MBS} --deadline $(( $(at 100) - 5 )) --out "$R" 2>&1 | grep -v "it/s]" > "$L/engine.log"
grep -a '"figure"' "$L/engine.log"
snap; echo "total $(( $(date +%s) - START )) s"
