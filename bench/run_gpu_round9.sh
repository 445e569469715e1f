#!/usr/bin/env bash
# Round 9's device calls (H200): overlapped decode (`overlap_decode`), measured against the
# stepwise loop it replaces, and goal 5 with both clients.
# PART=o (~9 min; run twice, as two calls): the in-process engine at 128/128 (c = 1/16/64/256,
#   three sweeps per engine start) and 1024/256 (c = 16/256), overlap off then on, twice
#   (alternating, so a drift of the machine shows in both); then the server (overlap on, the
#   default) with the project's client and AIPerf at both shapes.
# PART=r (~4 min): the replay engine (the serving layer alone) at an 8 and a 4 ms step, 256
#   streams, twice, AIPerf after the project's client at each step (replay_bench.py --aiperf).
# Prepared as in docs/performance.md (section R8): .whl/, .benchcarry/, .whl-aiperf/, and
#   .cache/dev-model for PART=r (the replay engine's tokenizer).
# Usage (device tool, carry [".whl", ".benchcarry", ".whl-aiperf"]): PART=o bash bench/run_gpu_round9.sh
set -u -o pipefail
BUDGET=${BUDGET:-520}
source bench/gpu_env.sh
bench_setup torch triton
LEVELS=${LEVELS:-1 16 64 256}
LONG_LEVELS=${LONG_LEVELS:-16 256}
engine() {  # $1: the last percent of the budget; the rest: gpu_bench engine options
  timeout $(left $1) $B engine "$ART" --skip-variants ${MBS:+--max-batch-size $MBS} ${XSET:-} "${@:2}" \
    --deadline $(at $1) --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-400
}
if [ "${PART:-o}" = o ]; then
  for I in 1 2; do
    engine $((I * 26 - 13)) --concurrency $LEVELS --repeat 3 --long --long-concurrency $LONG_LEVELS \
      --set overlap_decode=false
    engine $((I * 26)) --concurrency $LEVELS --repeat 3 --long --long-concurrency $LONG_LEVELS
  done
  timeout $(left 100) $B service "$ART" .benchcarry/ctx/app ${MBS:+--max-batch-size $MBS} ${XSET:-} \
    --concurrency $LEVELS --long --long-concurrency $LONG_LEVELS ${AIPERF_PY:+--aiperf} \
    --deadline $(( $(at 100) - 5 )) --log "$L/server-$RANDOM.log" --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-600
elif [ "${PART:-o}" = r ]; then
  replay_twice ${AIPERF_PY:+--aiperf}
fi
snap; echo "total $(( $(date +%s) - START )) s"
