#!/usr/bin/env bash
# Round 13's device calls (H200): several front-end processes over one engine process
# (`frontend_processes`; docs/performance.md, goal 5): the replay engine (256 streams, 16 in /
# 256 out) at an 8 and a 4 ms step, served by 1, 2 and 4 front-end processes, each with
# engine_process on (the same IPC to the engine in each), both clients in each server start.
# PART=f (~7 min): 1, 2, 4 front-ends at 8 ms, then at 4 ms.
# PART=b (~7 min): the same the other way round (4 ms first; 4, 2, 1 front-ends).
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
for S in $STEPS; do for N in $NS; do
  echo "{\"figure\": \"next_frontends\", \"frontend_processes\": $N, \"step_ms\": $S}" | tee -a "$R"
  timeout $(left 100) $PY bench/replay_bench.py --context .benchcarry/ctx --client-procs ${CPROCS:-4} \
    --requests-per-worker ${RPW:-4} --step-ms $S --set engine_process=on --set frontend_processes=$N \
    ${RARGS:-} ${AIPERF_PY:+--aiperf --aiperf-token-ids} 2>&1 | grep -a "^{" | tee -a "$R" | cut -c1-400
done; done
snap; echo "total $(( $(date +%s) - START )) s"
