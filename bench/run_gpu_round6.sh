#!/usr/bin/env bash
# Round 6's device calls (H200).
# PART=a (~5 min): 64 constrained chat streams (nested-object json_schema) vs 64 plain ones
#   with the batched masks (3 rounds) and row by row (2 rounds); start -> ready phases
#   (cold_start.py, page cache dropped, cProfile of the load) twice; the serving layer with the
#   replay engine at a 4 ms and an 8 ms step, 256 streams, twice each.
# PART=g: PART=a's structured-output part alone (BUDGET=200).
# PART=r (~3 min): the replay engine part of PART=a alone, twice, then once at Python's default
#   GIL switch interval (5 ms).
# PART=c (~6 min): server start -> ready and cold_start.py phases with the page cache dropped,
#   without and with .pyc, twice each; the batched masks again; the default server again
#   (both clients): the second run of PART=b's figures.
# PART=b (~9 min): in-process engine 128/128 at c = 1/16/64/256, chunked prefill off and
#   $CHUNKS (each twice) -> the real server, the same settings: the project's client and AIPerf
#   (an independent load generator) at each level -> the peer (transformers serve).
# Prepared as in docs/performance.md ("Round 6: commands"): .whl/ (server wheels),
#   .benchcarry/ctx/app, .benchcarry/tok; PART=a also .cache/dev-model (replay engine),
#   PART=b also .whl-aiperf/ (AIPerf's wheels).
# Usage (device tool, carry [".whl", ".benchcarry", ...]): PART=a bash bench/run_gpu_round6.sh
set -u -o pipefail
BUDGET=${BUDGET:-330}
source bench/gpu_env.sh
CHUNKS=${CHUNKS:-512}
device_env torch xgrammar
artifact_once

aiperf_setup
guided() {  # $1: guided_batch_mask, $2: rounds, $3: the last percent of the budget
  timeout $(left $3) $B service "$ART" .benchcarry/ctx/app ${MBS:+--max-batch-size $MBS} \
    --concurrency 1 --set guided_batch_mask=$1 ${XSET:-} --guided ${GUIDED:-64} --guided-rounds $2 \
    --deadline $(( $(at $3) - 3 )) --log "$L/server-guided-$1.log" --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-600
  snap
}
starts() {  # $1: a label; the server's start -> ready with the whole page cache dropped
  timeout $(left $2) $B service "$ART" .benchcarry/ctx/app --start-only ${DROP---drop-page-cache} \
    ${XSET:-} --log "$L/server-start-$1-$RANDOM.log" --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-300
}
cold() {  # cold_start.py phases with the whole page cache dropped
  timeout $(left $1) $PY bench/cold_start.py "$ART" --evict ${EVICT:-all} ${MBS:+--max-batch-size $MBS} \
    --profile ${PROFILE:-25} --out "$R" | cut -c1-300
}
replay() {  # the serving layer with the replay engine: 256 streams at 8 and 4 ms steps
  for S in 8 4; do
    timeout $(left $1) $PY bench/replay_bench.py --context .benchcarry/ctx --client-procs ${CPROCS:-4} \
      --requests-per-worker ${RPW:-4} --step-ms $S ${RSET:-} "${@:2}" | tee -a "$R" | cut -c1-400
  done
}
if [ "${PART:-a}" = r ]; then  # the serving layer alone: twice, then at Python's default GIL interval
  replay 40; replay 75; replay 100 --set gil_switch_interval_ms=5
elif [ "${PART:-a}" = g ]; then  # the structured-output part of PART=a alone
  guided true 3 55; guided false 2 100
elif [ "${PART:-a}" = c ]; then
  # Starts: as the image ships them (no .pyc), then with .pyc (PYTHONPYCACHEPREFIX stands
  # in for the image's build-time compileall: one warm start writes them).
  starts plain 10; starts plain 20; cold 27; cold 34
  export PYTHONPYCACHEPREFIX=/tmp/pyc
  DROP=" " starts pyc-fill 40; starts pyc 47; starts pyc 54; cold 60; cold 66
  unset PYTHONPYCACHEPREFIX
  guided true 2 76  # the batched masks again, in a second server start
  timeout $(left 100) $B service "$ART" .benchcarry/ctx/app ${MBS:+--max-batch-size $MBS} ${LEVELS:+--concurrency $LEVELS} \
    --set prefill_chunk_tokens=0 ${XSET:-} ${SECOND---aiperf} --deadline $(( $(at 100) - 5 )) \
    --log "$L/server-again-$RANDOM.log" --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-600
elif [ "${PART:-a}" = a ]; then
  guided true 3 35; guided false 2 55
  for I in 1 2; do
    timeout $(left 65) $PY bench/cold_start.py "$ART" --evict ${EVICT:-all} ${MBS:+--max-batch-size $MBS} \
      --profile 40 --out "$R" | cut -c1-300
  done
  for I in 1 2; do for S in 8 4; do
    timeout $(left 100) $PY bench/replay_bench.py --context .benchcarry/ctx --client-procs ${CPROCS:-4} \
      --requests-per-worker ${RPW:-4} --step-ms $S ${RSET:-} | tee -a "$R" | cut -c1-400
  done; done
else
  for C in 0 $CHUNKS; do
    timeout $(left 35) $B engine "$ART" --skip-variants ${MBS:+--max-batch-size $MBS} ${LEVELS:+--concurrency $LEVELS} \
      --set prefill_chunk_tokens=$C ${XSET:-} --repeat 2 --deadline $(at 35) --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-400
  done
  for C in 0 $CHUNKS; do
    timeout $(left 80) $B service "$ART" .benchcarry/ctx/app ${MBS:+--max-batch-size $MBS} ${LEVELS:+--concurrency $LEVELS} \
      --set prefill_chunk_tokens=$C ${XSET:-} ${SECOND---aiperf} --text-levels ${TEXT_LEVELS:-1 64 256} \
      --deadline $(( $(at 80) - 5 )) --log "$L/server-$C-$RANDOM.log" --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-600
    snap
  done
  [ -n "${SKIP_PEER:-}" ] || timeout $(left 100) $B peer "$ART" --text-levels ${TEXT_LEVELS:-1 64 256} \
    --peer-flags="${PEER_FLAGS---cb-use-cuda-graph}" --deadline $(( $(at 100) - 10 )) --log "$L/peer.log" \
    --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-400
fi
snap; echo "total $(( $(date +%s) - START )) s"
