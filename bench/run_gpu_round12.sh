#!/usr/bin/env bash
# Round 12's device calls (H200): the request start before and after round 12's change (a
# token-id prompt's numbers parsed in C and checked in one pass, its form picked from its
# first element; docs/performance.md, round 12), where it weighs most: long token-id prompts.
# PART=l (~8 min): the in-process engine at c = 256 (128/128) and 1024/256 (c = 16, 256),
#   then the server at the same levels importing the serving packages from before the change
#   (.before/) and then this tree's; both clients in each server start, AIPerf sending our
#   client's token-id bodies (--aiperf-token-ids), so both measure the same requests.
# PART=m (~8 min): PART=l with the two servers the other way round (this tree first).
# PART=r (~8 min): the replay engine (goal 5: 256 streams, 16 in / 256 out) at an 8 and a
#   4 ms step, the packages from before and after in alternate order, both clients.
# PART=g (~8 min): the replay engine as in PART=r, this tree only, with `access_log` all and
#   others in alternate order (whether leaving out the duplicate access line earns a default).
# One benchmark (this tree's bench/) and one build context for both; only the packages differ.
# Prepared as in docs/performance.md (section R9: .whl/, .benchcarry/, .whl-aiperf/) plus
# .before/, the serving packages before the change:
#   mkdir -p .before && git archive ab48305 mistral-trt-truss/packages | tar x -C .before
# Usage (device tool, carry [".whl", ".benchcarry", ".whl-aiperf", ".before"]):
#   PART=l bash bench/run_gpu_round12.sh
set -u -o pipefail
BUDGET=${BUDGET:-520}
source bench/gpu_env.sh
PKG_before=.before/mistral-trt-truss/packages
PKG_after=mistral-trt-truss/packages
[ -d $PKG_before/mistral_serving ] || { echo ".before/ is missing (see this script's header)"; exit 2; }
bench_setup torch triton
mark() { echo "{\"figure\": \"next_tree\", \"tree\": \"$1\"}" | tee -a "$R"; }
export LEVELS=${TOP_LEVELS:-256} LONG_LEVELS=${TOP_LONG:-16 256}
case "${PART:-l}" in
  l|m)  # m: this tree's packages first
    FIRST=before; SECOND=after; [ "$PART" = m ] && FIRST=after && SECOND=before
    engine 25
    P=PKG_$FIRST; mark $FIRST; service 62 --packages "$PWD/${!P}" --aiperf-token-ids
    P=PKG_$SECOND; mark $SECOND; service 100 --packages "$PWD/${!P}" --aiperf-token-ids
    ;;
  r)
    for I in 1 2; do
      ORDER="before after"; [ $I = 2 ] && ORDER="after before"
      for S in 8 4; do for T in $ORDER; do
        P=PKG_$T; mark $T
        timeout $(left 100) $PY bench/replay_bench.py --context .benchcarry/ctx \
          --packages "$PWD/${!P}" --client-procs ${CPROCS:-4} --requests-per-worker ${RPW:-4} \
          --step-ms $S ${RSET:-} ${AIPERF_PY:+--aiperf --aiperf-token-ids} 2>&1 \
          | grep -a "^{" | tee -a "$R" | cut -c1-400
      done; done
    done
    ;;
  g)
    for I in 1 2; do
      ORDER="all others"; [ $I = 2 ] && ORDER="others all"
      for S in 8 4; do for A in $ORDER; do
        echo "{\"figure\": \"next_access_log\", \"access_log\": \"$A\"}" | tee -a "$R"
        timeout $(left 100) $PY bench/replay_bench.py --context .benchcarry/ctx \
          --client-procs ${CPROCS:-4} --requests-per-worker ${RPW:-4} --step-ms $S \
          --set access_log=$A ${RSET:-} ${AIPERF_PY:+--aiperf --aiperf-token-ids} 2>&1 \
          | grep -a "^{" | tee -a "$R" | cut -c1-400
      done; done
    done
    ;;
esac
snap; echo "total $(( $(date +%s) - START )) s"
