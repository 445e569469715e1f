#!/usr/bin/env bash
# Round 13's device calls (H200): several front-end processes over one engine process
# (`frontend_processes`; docs/performance.md, goal 5): the replay engine (256 streams, 16 in /
# 256 out) at an 8 and a 4 ms step, served by 1, 2 and 4 front-end processes, each with
# engine_process on (the same IPC to the engine in each), both clients in each server start.
# PART=f (~8 min): 1, 2, 4 front-ends at 8 ms, then at 4 ms.
# PART=b (~8 min): the same the other way round (4 ms first; 4, 2, 1 front-ends).
# Prepared as in docs/performance.md (section R9: .whl/, .benchcarry/, .whl-aiperf/).
# Usage (device tool, carry [".whl", ".benchcarry", ".whl-aiperf"]):
#   PART=f bash bench/run_gpu_round13.sh
# On a CPU machine, small (~1 min): NOWHL=1 PY=.venv/bin/python OUT=/tmp/r13 \
#   RARGS="--concurrency 16 --output-len 32" CPROCS=1 RPW=1 bash bench/run_gpu_round13.sh
set -u -o pipefail
BUDGET=${BUDGET:-480}
source bench/gpu_env.sh
device_env torch; aiperf_setup
START=$(date +%s)
NS="1 2 4"; STEPS="8 4"
[ "${PART:-f}" = b ] && NS="4 2 1" && STEPS="4 8"
# Each server start on a port of its own, for at most CALL_S (a start that fails leaves the
# next ones their time and port); its server log and the benchmark's own output go to $L.
for S in $STEPS; do for N in $NS; do
  echo "{\"figure\": \"next_frontends\", \"frontend_processes\": $N, \"step_ms\": $S}" | tee -a "$R"
  T=$(left 100); [ "$T" -gt "${CALL_S:-110}" ] && T=${CALL_S:-110}
  timeout $T $PY bench/replay_bench.py --context .benchcarry/ctx --client-procs ${CPROCS:-4} \
    --requests-per-worker ${RPW:-4} --step-ms $S --set engine_process=on --set frontend_processes=$N \
    --port $((8100 + 10 * N + S)) ${RARGS:-} ${AIPERF_PY:+--aiperf --aiperf-token-ids} 2>&1 \
    | tee "$L/bench-f$N-s$S.txt" | grep -a "^{" | tee -a "$R" | cut -c1-400
  cp .cache/replay-bench-server.log "$L/server-f$N-s$S.log" 2>/dev/null
  pgrep -af "mistral_serving" | head -5 > "$L/left-f$N-s$S.txt"  # anything still running
done; done
snap; echo "total $(( $(date +%s) - START )) s"
