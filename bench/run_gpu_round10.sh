#!/usr/bin/env bash
# Round 10's device calls (H200): the generation routes served directly from the server's
# ASGI layer (`direct_routes`, server.DirectRoutes) against Truss's per-request wrapper.
# PART=d (~8 min): the replay engine (the serving layer alone) at an 8 and a 4 ms step, 256
#   streams, `direct_routes` on then off at each step, twice, AIPerf after the project's
#   client in each server start (replay_bench.py --aiperf).
# PART=s (~8 min): the in-process engine at 128/128 (c = 1/16/64/256) and 1024/256 (c =
#   16/256), then the server (the defaults: direct routes on) with both clients at both
#   shapes, then the server with `direct_routes=false` at c = 256 (128/128), both clients.
# PART=t (~4 min): PART=s's comparison again at c = 256 (128/128) alone, the other way round:
#   the engine, then the server with `direct_routes=false`, then with the defaults.
# Prepared as in docs/performance.md (section R9): .whl/, .benchcarry/, .whl-aiperf/.
# Usage (device tool, carry [".whl", ".benchcarry", ".whl-aiperf"]):
#   PART=d bash bench/run_gpu_round10.sh
set -u -o pipefail
BUDGET=${BUDGET:-520}
source bench/gpu_env.sh
bench_setup torch triton
case "${PART:-d}" in
  d)
    for I in 1 2; do for S in 8 4; do for D in true false; do
      echo "{\"figure\": \"next_replay\", \"direct_routes\": $D, \"step_ms\": $S, \"run\": $I}" | tee -a "$R"
      timeout $(left 100) $PY bench/replay_bench.py --context .benchcarry/ctx --client-procs ${CPROCS:-4} \
        --requests-per-worker ${RPW:-4} --step-ms $S --set direct_routes=$D ${RSET:-} ${AIPERF_PY:+--aiperf} \
        2>&1 | grep -a "^{" | tee -a "$R" | cut -c1-400
    done; done; done
    ;;
  s)
    engine 30
    service 78
    LEVELS=${TOP_LEVELS:-256} LONG_LEVELS= service 100 --set direct_routes=false
    ;;
  t)
    # (Run 35 gave the engine 25% of a 290 s budget: its 1024/256 ran out of time.)
    LEVELS=${TOP_LEVELS:-256} LONG_LEVELS=${TOP_LONG:-256} engine 35
    LEVELS=${TOP_LEVELS:-256} LONG_LEVELS= service 67 --set direct_routes=false
    LEVELS=${TOP_LEVELS:-256} LONG_LEVELS= service 100
    ;;
esac
snap; echo "total $(( $(date +%s) - START )) s"
