#!/usr/bin/env bash
# Round 7's device calls (H200).
# PART=a (~8 min): the sampler's step cost (sampler_bench.py); the in-process engine 128/128 at
#   c = 1/16/64/256 (chunked prefill off); the default server, greedy, with the project's
#   client and AIPerf (now sending the same temperature, 0) at each level; a second server
#   start sampling at temperature 1 (both clients) at c = 16/256.
# PART=b (~9 min): the fused kernels' GPU tests (tests/gpu, pytest from .whl-test/); the
#   decode step with and without them (step_bench.py); the sampler again; the in-process
#   engine with fused_kernels off and auto; the default server (fused on) greedy with both
#   clients, then sampling at temperature 1 with both clients at c = 16/256.
# PART=c (~3 min): cold starts with the page cache dropped (fused kernels on, their start-up
#   check included): cold_start.py phases twice, the server's start -> ready twice.
# Prepared as in docs/performance.md ("Round 7: commands"): .whl/ (server wheels),
#   .benchcarry/ctx/app, .benchcarry/tok, .whl-aiperf/ (AIPerf's wheels); PART=b also .whl-test/
#   (pytest, hypothesis and what they need, for Python 3.12).
# Usage (device tool, carry [".whl", ".benchcarry", ".whl-aiperf"]): PART=a bash bench/run_gpu_round7.sh
set -u -o pipefail
BUDGET=${BUDGET:-450}
source bench/gpu_env.sh
bench_setup torch triton
service() {  # $1: the last percent of the budget; the rest: gpu_bench service options
  timeout $(left $1) $B service "$ART" .benchcarry/ctx/app ${MBS:+--max-batch-size $MBS} ${XSET:-} \
    "${@:2}" --deadline $(( $(at $1) - 5 )) --log "$L/server-$RANDOM.log" --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-600
  snap
}
if [ "${PART:-a}" = a ]; then
  timeout $(left 6) $PY bench/sampler_bench.py ${SAMPLER_ROWS:+--rows $SAMPLER_ROWS} | tee -a "$R"
  timeout $(left 25) $B engine "$ART" --skip-variants ${MBS:+--max-batch-size $MBS} ${LEVELS:+--concurrency $LEVELS} \
    --set prefill_chunk_tokens=0 ${XSET:-} --deadline $(at 25) --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-400
  service 72 ${LEVELS:+--concurrency $LEVELS} --aiperf
  service 100 --concurrency ${SAMPLED_LEVELS:-16 256} --temperature 1 --aiperf
elif [ "${PART:-a}" = c ]; then
  for I in 1 2; do
    timeout $(left $((I * 25))) $PY bench/cold_start.py "$ART" --evict ${EVICT:-all} ${MBS:+--max-batch-size $MBS} \
      --out "$R" | cut -c1-300
  done
  for I in 1 2; do
    timeout $(left $((50 + I * 25))) $B service "$ART" .benchcarry/ctx/app --start-only ${DROP---drop-page-cache} \
      ${XSET:-} --log "$L/server-start-$I.log" --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-300
  done
elif [ "${PART:-a}" = b ]; then
  if [ -d .whl-test ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-test .whl-test/*.whl
    PYTHONPATH=/tmp/site-test:${PYTHONPATH:-} timeout $(left 7) $PY -m pytest -q -p no:cacheprovider \
      tests/gpu 2>&1 | tail -15 | tee "$OUT/gpu-tests.txt"
  fi
  timeout $(left 9) $PY bench/sampler_bench.py ${SAMPLER_ROWS:+--rows $SAMPLER_ROWS} | tee -a "$R"
  timeout $(left 20) $PY bench/step_bench.py ${STEP_FLAGS:-} --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-700
  for F in off auto; do
    timeout $(left $([ $F = off ] && echo 34 || echo 48)) $B engine "$ART" --skip-variants ${MBS:+--max-batch-size $MBS} \
      ${LEVELS:+--concurrency $LEVELS} --set fused_kernels=$F ${XSET:-} --deadline $(at $([ $F = off ] && echo 34 || echo 48)) \
      --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-400
  done
  service 80 ${LEVELS:+--concurrency $LEVELS} --aiperf
  service 100 --concurrency ${SAMPLED_LEVELS:-16 256} --temperature 1 --aiperf
fi
snap; echo "total $(( $(date +%s) - START )) s"
