#!/usr/bin/env bash
# Round 8's device calls (H200): every goal of the performance round measured again, twice.
# PART=a (~9 min; run twice, as two calls): the in-process engine at 128/128 (c = 1/16/64/256)
#   and 1024/256 (c = 16/256), chunked prefill off (the default); the default server with the
#   project's client and AIPerf at both shapes; the peer (`transformers serve`) at c = 1 and
#   256. (Runs 24-25 also tried PART=k's chunk runs here, which a script bug skipped.)
# PART=k (~4 min): the in-process engine at c = 256 with prefill_chunk_tokens = 512 and 2048
#   (128/128 twice, 1024/256 once), then the server with 512-token chunks at c = 256, both clients.
# PART=c (~4 min): cold starts with the whole page cache dropped: cold_start.py phases twice,
#   the server's start -> ready twice; the replay engine (the serving layer alone) at an 8
#   and a 4 ms step, 256 streams, twice. (Run 23 also ran a page-cache prefetch at launch,
#   after torch's import and off, from commit f6acab4: it lost, and was removed.)
# PART=r (~4 min): PART=c's replay-engine part alone, AIPerf after the project's client at each
#   step when .whl-aiperf/ is carried (replay_bench.py --aiperf).
# Prepared as in docs/performance.md (section R8): .whl/, .benchcarry/, .whl-aiperf/ (PART=a),
#   .cache/dev-model (PART=c and r: the replay engine's tokenizer).
# Usage (device tool, carry [".whl", ".benchcarry", ".whl-aiperf"]): PART=a bash bench/run_gpu_round8.sh
set -u -o pipefail
BUDGET=${BUDGET:-550}
source bench/gpu_env.sh
bench_setup torch triton
LONG_LEVELS=${LONG_LEVELS:-16 256}
CHUNKS=${CHUNKS:-512 2048}
engine() {  # $1: the last percent of the budget; the rest: gpu_bench engine options
  timeout $(left $1) $B engine "$ART" --skip-variants ${MBS:+--max-batch-size $MBS} ${XSET:-} "${@:2}" \
    --deadline $(at $1) --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-400
}
if [ "${PART:-a}" = a ]; then
  engine 29 ${LEVELS:+--concurrency $LEVELS} --long --long-concurrency $LONG_LEVELS
  timeout $(left 83) $B service "$ART" .benchcarry/ctx/app ${MBS:+--max-batch-size $MBS} ${XSET:-} \
    ${LEVELS:+--concurrency $LEVELS} --long --long-concurrency $LONG_LEVELS --aiperf \
    --deadline $(( $(at 83) - 5 )) --log "$L/server-$RANDOM.log" --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-600
  snap
  [ -n "${SKIP_PEER:-}" ] || timeout $(left 100) $B peer "$ART" --text-levels ${PEER_LEVELS:-1 256} \
    --peer-flags="${PEER_FLAGS---cb-use-cuda-graph}" --deadline $(( $(at 100) - 10 )) --log "$L/peer.log" \
    --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-400
elif [ "${PART:-a}" = k ]; then  # chunked prefill
  for C in $CHUNKS; do
    engine $([ "$C" = "${CHUNKS%% *}" ] && echo 25 || echo 50) --concurrency ${TOP:-256} --repeat 2 \
      --long --long-concurrency ${TOP:-256} --set prefill_chunk_tokens=$C
  done
  timeout $(left 100) $B service "$ART" .benchcarry/ctx/app ${MBS:+--max-batch-size $MBS} ${XSET:-} \
    --concurrency ${TOP:-256} --long --long-concurrency ${TOP:-256} --aiperf --set prefill_chunk_tokens=${CHUNKS%% *} \
    --deadline $(( $(at 100) - 5 )) --log "$L/server-chunk-$RANDOM.log" --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-600
elif [ "${PART:-a}" = c ]; then
  for I in 1 2; do
    timeout $(left $((I * 25))) $PY bench/cold_start.py "$ART" --evict ${EVICT:-all} \
      ${MBS:+--max-batch-size $MBS} --out "$R" | cut -c1-300
  done
  for I in 1 2; do
    timeout $(left $((50 + I * 10))) $B service "$ART" .benchcarry/ctx/app --start-only ${DROP---drop-page-cache} \
      ${XSET:-} --log "$L/server-start-$I-$RANDOM.log" --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-300
  done
  replay_twice
elif [ "${PART:-a}" = r ]; then  # the serving layer alone, with both clients (carry .whl-aiperf too)
  replay_twice ${AIPERF_PY:+--aiperf}
fi
snap; echo "total $(( $(date +%s) - START )) s"
