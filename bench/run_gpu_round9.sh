#!/usr/bin/env bash
# Round 9's device calls (H200): the decode-attention kernel (engines/pytorch/fused.py) and
# overlapped decode (`overlap_decode`), each against what it replaces; goal 5 with both
# clients; cold starts with the Triton cache empty and kept; the peer.
# PART=a (~9 min): the fused kernels' GPU tests (pytest from .whl-test/); the captured decode
#   step with torch's ops, the fused kernels with torch's SDPA attention, and the kernels with
#   the attention kernel (step_bench.py, 256 columns with the kernel breakdown, 1280 without);
#   the in-process engine at 128/128 (c = 1/16/64/256) and 1024/256 (c = 16/256), overlap off
#   then on; the server (the defaults) with the project's client and AIPerf at both shapes.
# PART=b (~6 min): the three steps again without the kernel breakdown (PART=a's ran out of
#   its time share after torch's ops), the engine (defaults) and the server with both clients.
# PART=o (~9 min): the engine only, overlap off then on, twice (alternating, so a drift of the
#   machine shows in both), three sweeps per start; then the server with both clients.
# PART=r (~7 min): the three steps again (PART=b's step_bench lost its graph pool between
#   variants), then the replay engine (the serving layer alone) at an 8 and a 4 ms step, 256
#   streams, twice, AIPerf after the project's client at each step (replay_bench.py --aiperf).
# PART=c (~5 min): cold starts with the whole page cache dropped, each first with an empty
#   Triton cache and then with the one it left (what a restarted server finds in cache_dir):
#   cold_start.py's phases twice each, then the server's start -> ready twice each.
# PART=p (~9 min): the engine and the server (both clients) at 128/128 and 1024/256, then the
#   peer (`transformers serve --continuous-batching`) at c = 1 and 256 in the same call.
# PART=cp (~10 min, BUDGET=560, when one call is all there is): PART=c's starts once each way
#   plus cold_start.py's pair again, then the engine (c = 1 and 256, and 1024/256 at 256), the
#   server with both clients at c = 1 and 256 (128/128) and the peer, as PART=p.
# PART=q (~3 min, BUDGET=330): a cold pair (Triton cache empty, kept), the server at c = 1 and
#   256 with the project's client, the peer.
# Prepared as in docs/performance.md (section R9): .whl/, .benchcarry/, .whl-aiperf/ (together
#   under the device call's 64 MiB with the tree; the image has pytest and hypothesis).
# Usage (device tool, carry [".whl", ".benchcarry", ".whl-aiperf"]):
#   PART=a bash bench/run_gpu_round9.sh
set -u -o pipefail
BUDGET=${BUDGET:-520}
source bench/gpu_env.sh
bench_setup torch triton
gpu_tests() {  # $1: the last percent of the budget (pytest and hypothesis: the image's, or .whl-test/)
  [ -d .whl-test ] && $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-test .whl-test/*.whl
  PYTHONPATH=/tmp/site-test:${PYTHONPATH:-} timeout $(left $1) $PY -m pytest -q -p no:cacheprovider \
    --noconftest tests/gpu/test_fused_kernels.py 2>&1 | tail -15 | tee "$OUT/gpu-tests.txt"
}
steps() {  # $1, $2: the last percents of the budget for the 256- and the 1280-column steps; $3...: options
  for W in 256 1280; do
    timeout $(left $([ $W = 256 ] && echo $1 || echo $2)) $PY bench/step_bench.py --skip-linear --width $W \
      ${STEP_FLAGS:-} "${@:3}" --out "$R" 2>&1 | tee "$L/step-$W.log" | grep -a '"figure"' | cut -c1-300
  done
}
cold() {  # $1: the last percent of the budget, $2: empty|kept, $3: which Triton cache
  [ $2 = empty ] && rm -rf /tmp/triton-$3
  TRITON_CACHE_DIR=/tmp/triton-$3 timeout $(left $1) $PY bench/cold_start.py "$ART" \
    --evict ${EVICT:-all} ${MBS:+--max-batch-size $MBS} --out "$R" | cut -c1-300
}
server_start() {  # as cold(), the server's start -> ready
  [ $2 = empty ] && rm -rf /tmp/triton-$3
  echo "{\"figure\": \"next_start\", \"triton_cache\": \"$2\"}" | tee -a "$R"
  TRITON_CACHE_DIR=/tmp/triton-$3 timeout $(left $1) $B service "$ART" .benchcarry/ctx/app --start-only \
    ${DROP---drop-page-cache} ${XSET:-} --log "$L/server-start-$3-$2.log" --out "$R" 2>&1 \
    | grep -a '"figure"' | cut -c1-300
}
peer() {  # $1: the last percent of the budget: `transformers serve` at c = 1 and 256 (text prompts)
  timeout $(left $1) $B peer "$ART" --text-levels ${PEER_LEVELS:-1 256} \
    --peer-flags="${PEER_FLAGS---cb-use-cuda-graph}" --deadline $(( $(at $1) - 10 )) --log "$L/peer.log" \
    --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-400
}
case "${PART:-a}" in
  a)
    gpu_tests 10
    steps 22 30
    engine 47 --repeat 2 --set overlap_decode=false
    engine 64 --repeat 2
    service 100
    ;;
  b)
    steps 15 25 --skip-profile
    engine 45 --repeat 2
    service 100
    ;;
  o)
    for I in 1 2; do
      engine $((I * 26 - 13)) --repeat 3 --set overlap_decode=false
      engine $((I * 26)) --repeat 3
    done
    service 100
    ;;
  r)
    steps 9 16 --skip-profile
    replay_twice ${AIPERF_PY:+--aiperf}
    ;;
  c)
    for I in 1 2; do cold $((I * 25 - 13)) empty $I; cold $((I * 25)) kept $I; done
    for I in 1 2; do server_start $((I * 25 + 37)) empty s$I; server_start $((I * 25 + 50)) kept s$I; done
    ;;
  p)
    engine 30 --repeat 2
    service 75
    snap
    peer 100
    ;;
  q)  # run 32: a cold pair, the server at c = 1 and 256 (our client), the peer
    cold 11 empty 3; cold 22 kept 3
    LEVELS=${TOP_LEVELS:-1 256} LONG_LEVELS= AIPERF_PY= service 45
    peer 100
    ;;
  cp)
    # (Run 31 gave the first pair 6 and 11% of a 480 s budget: both ran out of time.)
    cold 8 empty 1; cold 15 kept 1; server_start 21 empty s1; server_start 27 kept s1
    cold 34 empty 2; cold 41 kept 2
    LEVELS=${TOP_LEVELS:-1 256} LONG_LEVELS=${TOP_LONG:-256} engine 52
    LEVELS=${TOP_LEVELS:-1 256} LONG_LEVELS= service 75
    snap
    peer 100
    ;;
esac
snap; echo "total $(( $(date +%s) - START )) s"
