# Set-up shared by the run_gpu*.sh device scripts (sourced, after a script sets its own
# defaults): $OUT, $PY, the wheels the device image lacks (from .whl/, unless NOWHL is set),
# $ART and $CACHE (artifact, verified-marker cache), $R (results) and $L (logs), snap (tar
# the logs into $OUT), at/left (deadlines as a percent of $BUDGET), $B (gpu_bench.py),
# replay_twice (the replay engine at an 8 and a 4 ms step, twice), engine and service
# (gpu_bench.py's in-process engine and server at $LEVELS, default 1 16 64 256, and 1024/256
# at $LONG_LEVELS, default 16 256; service runs no 1024/256 when LONG_LEVELS is set empty).
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
PY=${PY:-python3}
START=$(date +%s)
BUDGET=${BUDGET:-540}
ART=${ART:-/tmp/mistral-7b-random}
CACHE=${CACHE:-/tmp/mtt-cache}
if [ -d .whl ] && [ -z "${NOWHL:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
R="$OUT/results.jsonl"
L=${LOGS:-/tmp/bench-logs}; mkdir -p "$L"
snap() { tar czf "$OUT/logs.tgz" -C "$L" . 2>/dev/null; }
at() { echo $((START + BUDGET * $1 / 100)); }   # a deadline: percent of the budget
left() { echo $(( $(at $1) - $(date +%s) )); }   # seconds until it (a phase's timeout)
B="$PY bench/gpu_bench.py"
aiperf_setup() {  # AIPerf from .whl-aiperf/ on its own path (its fastapi/pydantic must not reach the server)
  [ -d .whl-aiperf ] && [ -z "${AIPERF_PY:-}" ] || return 0
  mkdir -p /tmp/ap && for w in .whl-aiperf/*.whl; do $PY -m zipfile -e "$w" /tmp/ap; done
  printf '#!/bin/sh\nPYTHONPATH=/tmp/ap exec %s "$@"\n' "$PY" > /tmp/aiperf-py && chmod +x /tmp/aiperf-py
  export AIPERF_PY=/tmp/aiperf-py; $AIPERF_PY -m aiperf --version 2>&1 | tail -1
}
device_env() {  # the machine and the versions of the packages named: $OUT/env.txt
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; free -g | head -2
    $PY -c 'import sys, importlib.metadata as m; [print(n, m.version(n)) for n in sys.argv[1:]]' "$@"
  } 2>&1 | tee "$OUT/env.txt"
}
artifact_once() {  # the 7B-shaped random artifact (tiny with TINY set), made once per machine
  [ -f "$ART/config.json" ] || $B make-artifact "$ART" --tokenizer-from .benchcarry/tok ${TINY:+--tiny} \
    --out "$R" 2>&1 | grep -v "it/s]" | tail -3
}
bench_setup() {  # a round script's set-up: device_env "$@", the artifact, AIPerf; the budget counts from here
  device_env "$@"; artifact_once; aiperf_setup
  START=$(date +%s)  # the set-up above varies (~30 s): the budget's percentages count from here
}
replay_twice() {  # the replay engine at an 8 and a 4 ms step, 256 streams, twice; "$@": replay_bench options
  for I in 1 2; do for S in 8 4; do
    timeout $(left 100) $PY bench/replay_bench.py --context .benchcarry/ctx --client-procs ${CPROCS:-4} \
      --requests-per-worker ${RPW:-4} --step-ms $S ${RSET:-} "$@" 2>&1 | grep -a "^{" | tee -a "$R" | cut -c1-400
  done; done
}
engine() {  # $1: the last percent of the budget; the rest: gpu_bench engine options
  timeout $(left $1) $B engine "$ART" --skip-variants ${MBS:+--max-batch-size $MBS} ${XSET:-} \
    --concurrency ${LEVELS:-1 16 64 256} --long --long-concurrency ${LONG_LEVELS:-16 256} "${@:2}" \
    --deadline $(at $1) --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-400
}
service() {  # $1: the last percent of the budget; the rest: gpu_bench service options (AIPerf too when AIPERF_PY is set)
  local long=${LONG_LEVELS-16 256}
  timeout $(left $1) $B service "$ART" .benchcarry/ctx/app ${MBS:+--max-batch-size $MBS} ${XSET:-} \
    --concurrency ${LEVELS:-1 16 64 256} ${long:+--long --long-concurrency $long} ${AIPERF_PY:+--aiperf} \
    "${@:2}" --deadline $(( $(at $1) - 5 )) --log "$L/server-$RANDOM.log" --out "$R" 2>&1 \
    | grep -a '"figure"' | cut -c1-600
}
