#!/usr/bin/env bash
# Round 11's device call (H200): the engine in a process of its own (`engine_process`), the
# cost and the gain of its IPC, for the serving layer alone and for the PyTorch engine.
# PART=p (~8 min): the replay engine at an 8 and a 4 ms step, 256 streams, in the server's
#   process and in its own (`engine_process` off / on), twice, in the other order the second
#   time; AIPerf after the project's client in each server start (replay_bench.py --aiperf,
#   which also reads the engine process's own CPU time).
# PART=s (~5 min): the in-process PyTorch engine at c = 256 (128/128 and 1024/256), then
#   the server at c = 256 (128/128) with `engine_process` off and then on, both clients.
# PART=t (~5 min): PART=s the other way round (the server with `engine_process` on first).
# PART=a (~7 min): the in-process engine at every level (c = 1/16/64/256 at 128/128, 16/256
#   at 1024/256), then the server with `engine_process` on at the same levels, both clients.
# PART=b (~4 min): PART=a again at the levels below 256 (c = 1/16/64, and 16 at 1024/256).
# Prepared as in docs/performance.md (section R9): .whl/, .benchcarry/, .whl-aiperf/.
# Usage (device tool, carry [".whl", ".benchcarry", ".whl-aiperf"]):
#   PART=p bash bench/run_gpu_round11.sh
set -u -o pipefail
BUDGET=${BUDGET:-520}
source bench/gpu_env.sh
bench_setup torch triton
case "${PART:-p}" in
  p)
    for I in 1 2; do
      ORDER="off on"; [ $I = 2 ] && ORDER="on off"
      for S in 8 4; do for E in $ORDER; do
        echo "{\"figure\": \"next_replay\", \"engine_process\": \"$E\", \"step_ms\": $S, \"run\": $I}" | tee -a "$R"
        timeout $(left 100) $PY bench/replay_bench.py --context .benchcarry/ctx --client-procs ${CPROCS:-4} \
          --requests-per-worker ${RPW:-4} --step-ms $S --set engine_process=$E ${RSET:-} ${AIPERF_PY:+--aiperf} \
          2>&1 | grep -a "^{" | tee -a "$R" | cut -c1-400
      done; done
    done
    ;;
  s|t)  # t: the server with `engine_process` on first
    FIRST=off; SECOND=on; [ "$PART" = t ] && FIRST=on && SECOND=off
    LEVELS=${TOP_LEVELS:-256} LONG_LEVELS=${TOP_LONG:-256} engine 30
    LEVELS=${TOP_LEVELS:-256} LONG_LEVELS= service 62 --set engine_process=$FIRST
    LEVELS=${TOP_LEVELS:-256} LONG_LEVELS= service 100 --set engine_process=$SECOND
    ;;
  a)
    engine 38
    service 100 --set engine_process=on
    ;;
  b)
    LEVELS=${B_LEVELS:-1 16 64} LONG_LEVELS=${B_LONG:-16} engine 38
    LEVELS=${B_LEVELS:-1 16 64} LONG_LEVELS=${B_LONG:-16} service 100 --set engine_process=on
    ;;
esac
snap; echo "total $(( $(date +%s) - START )) s"
