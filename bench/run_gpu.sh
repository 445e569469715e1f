#!/usr/bin/env bash
# The GPU figures of docs/performance.md, part by part, on one GPU machine, from the
# repository root (the figures there are an H200's: 141 GB; the benchmark's static KV cache,
# 256 slots x 2,048 tokens, takes 64 GiB beside the 14.5 GB of weights, so a GPU of 80 GB
# needs MBS=128, which leaves out the levels at 256 streams):
#
#   bash bench/run_gpu.sh PART [PART ...]
#
# Each part writes JSON lines to $OUT/results.jsonl (one per figure, bench/gpu_bench.py's
# rows) and its logs to $OUT/logs.tgz, and stops its sweeps at its time budget (BUDGET
# seconds, each part's default below; the set-up before the first part is not counted).
#
#   prepare     on a development machine with network access, before the GPU machine: what
#               a GPU machine without network needs, in ignored folders beside the tree:
#               .benchcarry/ (the rendered Truss app folder and the dev tokenizer), .whl/
#               (wheels of the server's imports the GPU image lacks, at this venv's
#               versions), .whl-aiperf/ (AIPerf's, bench/tool_wheels.sh --lean).
#   engine      goal 3 (~5 min): the engine in-process, 128 in / 128 out at c = 1/16/64/256
#               twice, 1024 in / 256 out at c = 16/256, and the captured decode step's GPU
#               time at 1/16/64/256 rows. CORRECTNESS=1: also the static path's greedy tokens
#               against an fp32 reference (gpu_bench.py engine --correctness).
#   server      goals 1 and 2 (~8 min per server start): the engine in-process (one sweep,
#               the shares' denominator), then the real server at the same levels, measured
#               by the project's client and then by AIPerf (our client's token-id bodies) in
#               the same server start. SETS: one server start per entry, each entry
#               KEY=VALUE settings joined by commas, `defaults` for none (default:
#               "defaults"; e.g. SETS="engine_process=off engine_process=on").
#   frontends   goal 5 (~8 min): the replay engine (no model) at an 8 and a 4 ms step, 256
#               streams of 16 in / 256 out, served by 1, 2 and 4 front-end processes over
#               one engine process, both clients in each server start. FRONTENDS ("1 2 4";
#               `off`: the defaults, the engine in the server's process), STEPS_MS ("8 4"),
#               REVERSE=1: the same the other way round (run both orders).
#   cold        goal 4 (~6 min): the whole page cache dropped (root) before each start, first
#               with an empty Triton cache (a new pod) and then with the one it left (a
#               restarted container), twice: bench/cold_start.py's phases, then the server's
#               start -> ready.
#   peer        goal 6 (~6 min): the server at c = 1 and 256 (both clients), then
#               `transformers serve --continuous-batching --cb-use-cuda-graph` at the same
#               levels with the project's client (text prompts).
#   step        goal 3's cause (~5 min): bench/step_bench.py, the captured step with torch's
#               ops, the fused kernels with torch's attention, and the fused kernels with the
#               decode-attention kernel, at 256 columns (with the kernel breakdown) and 1,280.
#   kernels     the fused kernels' GPU tests (tests/gpu/test_fused_kernels.py; pytest and
#               hypothesis from the image, or from .whl-test/ when present).
#   structured  structured output (~9 min): the grammar's mask and the sampler's step on the
#               GPU (bench/guided_bench.py --part device), then the schema suite
#               (bench/schemas/, SOURCES.md) in one server start with the engine's timers on
#               (GUIDED_PROFILE_OUT): at SUITE_LEVELS ("16 64") chat streams, plain, then each
#               accepted schema as response_format and as a forced tool's parameters, our
#               client for every schema and AIPerf for the first SUITE_AIPERF (4), until the
#               budget; SUITE_SCHEMAS (0: all 24) and SUITE_SKIP (0) pick a slice of the suite
#               (the whole suite at both levels takes about two calls), SUITE_MAX_TOKENS (128).
#               GUIDED_OLD=1: also the project's own schema, 64 constrained vs 64 plain.
#   tensorrt-speeds  the serving layer at TensorRT-LLM's speeds (~5 min, no GPU needed but
#               the GPU machine's 16 cores): the replay engine with the defaults (the engine
#               in the server's process, as the TensorRT-LLM kinds serve) at TRT_STEPS
#               ("GPU:streams:step_ms ...": TensorRT-LLM 1.2's decode step on an A100 and an
#               H100 at 64 and 256 streams, docs/performance.md derives them), 128 in / 128
#               out, both clients, TRT_RUNS (2) runs, the second in reverse order.
#   round4      the round's figures in one call (~7.5 min of parts, ~9 min with the set-up;
#               its header in the script says what it runs).
#   profile     where the server's time goes at c = 256 (~6 min): bench/profile_server.py
#               with py-spy (from .whl/); bench/profile_summary.py OUT turns it into text.
#
# Environment (all optional): OUT (/tmp/bench-out), PY (python3), BUDGET (seconds for each
# part), ART (/tmp/mistral-7b-random: the artifact, made once per machine), LEVELS ("1 16 64
# 256") and LONG_LEVELS ("16 256"; empty: no 1024/256), MBS (max_batch_size, 256), XSET
# (more gpu_bench.py options for the engine and the server, e.g. "--set device=cpu"),
# AIPERF_PY (AIPerf's python; unset: from .whl-aiperf/ if present, else no AIPerf),
# NOWHL=1 (use PY's own packages, not .whl/), TINY=1 (a tiny random model: a CPU check).
# CPU checks of each part: docs/performance.md, "Reproducing".
set -u -o pipefail
OUT=${OUT:-/tmp/bench-out}; mkdir -p "$OUT"
PY=${PY:-python3}
ART=${ART:-/tmp/mistral-7b-random}
R="$OUT/results.jsonl"
L=${LOGS:-/tmp/bench-logs}; mkdir -p "$L"
export LOGS=$L PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
B="$PY bench/gpu_bench.py"
APP=.benchcarry/ctx/app
[ $# -gt 0 ] || { sed -n '2,/^set -u/p' "$0" | sed '$d'; exit 2; }

# ---- set-up and helpers ----

snap() { tar czf "$OUT/logs.tgz" -C "$L" . 2>/dev/null; }
begin() {  # $1: the part's name, $2: its default budget; its deadlines count from here
  START=$(date +%s); PART_BUDGET=${BUDGET:-$2}
  echo "{\"figure\": \"part\", \"part\": \"$1\", \"budget_s\": $PART_BUDGET}" | tee -a "$R"
}
at() { echo $((START + PART_BUDGET * $1 / 100)); }  # a deadline: percent of the part's budget
left() { echo $(( $(at $1) - $(date +%s) )); }       # seconds until it (a phase's timeout)
wheels() {  # the server's imports the GPU image lacks, from .whl/, on PYTHONPATH
  [ -d .whl ] && [ -z "${NOWHL:-}" ] || return 0
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
}
aiperf_setup() {  # AIPerf from .whl-aiperf/ on its own path (its fastapi/pydantic must not reach the server)
  [ -d .whl-aiperf ] && [ -z "${AIPERF_PY:-}" ] || return 0
  mkdir -p /tmp/ap && for w in .whl-aiperf/*.whl; do $PY -m zipfile -e "$w" /tmp/ap; done
  printf '#!/bin/sh\nPYTHONPATH=/tmp/ap exec %s "$@"\n' "$PY" > /tmp/aiperf-py && chmod +x /tmp/aiperf-py
  export AIPERF_PY=/tmp/aiperf-py; $AIPERF_PY -m aiperf --version 2>&1 | tail -1
}
device_env() {  # the machine and the versions that matter: $OUT/env.txt
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; free -g | head -2
    $PY -c 'import sys, importlib.metadata as m; [print(n, m.version(n)) for n in sys.argv[1:]]' \
      torch triton transformers
  } 2>&1 | tee "$OUT/env.txt"
}
artifact_once() {  # the 7B-shaped random artifact (tiny with TINY set), made once per machine
  [ -f "$ART/config.json" ] || $B make-artifact "$ART" --tokenizer-from .benchcarry/tok ${TINY:+--tiny} \
    --out "$R" 2>&1 | grep -v "it/s]" | tail -3
}
aiperf_flags() { [ -n "${AIPERF_PY:-}" ] && echo "--aiperf --aiperf-token-ids"; }
engine() {  # $1: the last percent of the budget; the rest: gpu_bench.py engine options
  timeout $(left $1) $B engine "$ART" --skip-variants ${MBS:+--max-batch-size $MBS} ${XSET:-} \
    --concurrency ${LEVELS:-1 16 64 256} --long --long-concurrency ${LONG_LEVELS:-16 256} "${@:2}" \
    --deadline $(at $1) --out "$R" 2>&1 | tee -a "$L/engine.log" | grep -a '"figure"' | cut -c1-400
}
service() {  # $1: the last percent of the budget; the rest: gpu_bench.py service options
  local long=${LONG_LEVELS-16 256}
  timeout $(left $1) $B service "$ART" $APP ${MBS:+--max-batch-size $MBS} ${XSET:-} \
    --concurrency ${LEVELS:-1 16 64 256} ${long:+--long --long-concurrency $long} $(aiperf_flags) \
    "${@:2}" --deadline $(( $(at $1) - 5 )) --log "$L/server-$RANDOM.log" --out "$R" 2>&1 \
    | grep -a '"figure"' | cut -c1-600
}
set_flags() {  # "k=v,k2=v2" -> --set k=v --set k2=v2 ("defaults": none)
  [ "$1" = defaults ] && return 0
  local IFS=,; for kv in $1; do printf -- '--set %s ' "$kv"; done
}

# ---- the parts ----

part_prepare() {
  mkdir -p .benchcarry/tok
  PYTHONPATH=mistral-trt-truss/packages $PY -c "from pathlib import Path
from mistral_build.local_server import render_build_context, prepare_app_dir
prepare_app_dir(render_build_context(Path('.benchcarry/ctx').resolve()))" >/dev/null || exit 1
  rm -rf .benchcarry/ctx/packages  # the server imports the tree's own packages instead
  cp .cache/dev-model/tokenizer{.model,.json,_config.json} .benchcarry/tok/ || exit 1
  [ -z "${NOWHL:-}" ] || return 0
  # The server's and the client's imports missing from the GPU image (Python 3.12, x86-64).
  local names="fastapi starlette uvicorn pydantic pydantic-core annotated-types annotated-doc
    typing-inspection python-json-logger msgpack-numpy opentelemetry-api opentelemetry-sdk
    opentelemetry-semantic-conventions opentelemetry-exporter-otlp-proto-http
    opentelemetry-exporter-otlp-proto-common opentelemetry-proto googleapis-common-protos
    importlib-metadata opentelemetry-exporter-http-transport opentelemetry-exporter-otlp-common
    protobuf xgrammar apache-tvm-ffi openai httpx2 httpcore2 truststore distro jiter sniffio
    tenacity httpx-sse httptools msgspec pydantic-settings python-dotenv mistral-common
    pycountry pydantic-extra-types jsonschema jsonschema-specifications referencing rpds-py
    loguru aiocontextvars websockets py-spy"
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d .whl $($PY -c 'import sys, importlib.metadata as m
print(" ".join(f"{n}=={m.version(n)}" for n in sys.argv[1:]))' $names) || exit 1
  bash bench/tool_wheels.sh .whl-aiperf --lean
  du -sh .whl .whl-aiperf .benchcarry
}

part_engine() {
  begin engine 300
  engine 100 --repeat ${REPEAT:-2} ${CORRECTNESS:+--correctness}
}

part_server() {
  local sets=(${SETS:-defaults}) i=0
  # ~150 s for the engine, ~320 s for each server start (both clients, both shapes).
  local share=$((100 * 150 / (150 + 320 * ${#sets[@]})))
  begin server $((150 + 320 * ${#sets[@]}))
  engine $share
  for S in "${sets[@]}"; do
    i=$((i + 1))
    echo "{\"figure\": \"next_server\", \"set\": \"$S\"}" | tee -a "$R"
    service $((share + (100 - share) * i / ${#sets[@]})) $(set_flags "$S")
    snap
  done
}

part_frontends() {
  begin frontends 480
  local ns=${FRONTENDS:-1 2 4} steps=${STEPS_MS:-8 4}
  [ -n "${REVERSE:-}" ] && ns=$(echo $ns | tr ' ' '\n' | tac | xargs) && steps=$(echo $steps | tr ' ' '\n' | tac | xargs)
  # Each server start on a port of its own, for at most CALL_S (a start that fails leaves the
  # next ones their time and port); its server log and the benchmark's own output go to $L.
  for S in $steps; do for N in $ns; do
    local sets="" port=$((8100 + S))
    [ "$N" = off ] || { sets="--set engine_process=on --set frontend_processes=$N"; port=$((port + 10 * N)); }
    echo "{\"figure\": \"next_frontends\", \"frontend_processes\": \"$N\", \"step_ms\": $S}" | tee -a "$R"
    local t=$(left 100); [ "$t" -gt "${CALL_S:-110}" ] && t=${CALL_S:-110}
    timeout $t $PY bench/replay_bench.py --context .benchcarry/ctx --client-procs ${CPROCS:-4} \
      --requests-per-worker ${RPW:-4} --step-ms $S $sets --port $port ${RARGS:-} $(aiperf_flags) 2>&1 \
      | tee "$L/bench-f$N-s$S.txt" | grep -a "^{" | tee -a "$R" | cut -c1-400
    cp .cache/replay-bench-server.log "$L/server-f$N-s$S.log" 2>/dev/null
  done; done
}

cold() {  # $1: the last percent of the budget, $2: empty|kept, $3: which Triton cache
  [ $2 = empty ] && rm -rf /tmp/triton-$3
  TRITON_CACHE_DIR=/tmp/triton-$3 timeout $(left $1) $PY bench/cold_start.py "$ART" \
    --evict ${EVICT:-all} ${MBS:+--max-batch-size $MBS} --out "$R" | cut -c1-300
}
server_start() {  # as cold(), the server's start -> ready
  [ $2 = empty ] && rm -rf /tmp/triton-$3
  echo "{\"figure\": \"next_start\", \"triton_cache\": \"$2\"}" | tee -a "$R"
  TRITON_CACHE_DIR=/tmp/triton-$3 timeout $(left $1) $B service "$ART" $APP --start-only \
    ${DROP---drop-page-cache} ${XSET:-} --log "$L/server-start-$3-$2.log" --out "$R" 2>&1 \
    | grep -a '"figure"' | cut -c1-300
}
part_cold() {
  begin cold 360
  for I in 1 2; do cold $((I * 25 - 13)) empty $I; cold $((I * 25)) kept $I; done
  for I in 1 2; do server_start $((I * 25 + 37)) empty s$I; server_start $((I * 25 + 50)) kept s$I; done
}

part_peer() {
  begin peer 360
  LEVELS=${PEER_LEVELS:-1 256} LONG_LEVELS= service 45
  snap
  PYTHONPATH=${PEER_PYTHONPATH:-${PYTHONPATH:-}} timeout $(left 100) $B peer "$ART" --text-levels ${PEER_LEVELS:-1 256} \
    --peer-flags="${PEER_FLAGS---cb-use-cuda-graph}" --deadline $(( $(at 100) - 10 )) --log "$L/peer.log" \
    --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-400
}

part_step() {
  begin step 300
  for W in 256 1280; do
    local flags=""; [ $W = 1280 ] && flags=--skip-profile
    timeout $(left $([ $W = 256 ] && echo 60 || echo 100)) $PY bench/step_bench.py --skip-linear \
      --width $W $flags ${STEP_FLAGS:-} --out "$R" 2>&1 | tee "$L/step-$W.log" | grep -a '"figure"' | cut -c1-300
  done
}

part_kernels() {
  begin kernels 300
  [ -d .whl-test ] && $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-test .whl-test/*.whl
  PYTHONPATH=/tmp/site-test:${PYTHONPATH:-} timeout $(left 100) $PY -m pytest -q -p no:cacheprovider \
    --noconftest tests/gpu/test_fused_kernels.py 2>&1 | tail -15 | tee "$OUT/gpu-tests.txt"
}

suite() {  # $1: the last percent of the budget: the schema suite in one server start
  timeout $(left $1) $B service "$ART" $APP ${MBS:+--max-batch-size $MBS} ${XSET:-} --concurrency \
    --suite --suite-levels ${SUITE_LEVELS:-16 64} --suite-schemas ${SUITE_SCHEMAS:-0} \
    --suite-skip ${SUITE_SKIP:-0} --suite-aiperf ${SUITE_AIPERF:-4} --suite-max-tokens \
    ${SUITE_MAX_TOKENS:-128} $(aiperf_flags) --deadline $(( $(at $1) - 5 )) \
    --log "$L/server-suite-$RANDOM.log" --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-700
  cp "$L/guided-profile.json" "$L/guided-profile-$RANDOM.json" 2>/dev/null
}
part_structured() {
  begin structured 540
  timeout $(left 8) $PY bench/guided_bench.py --part device --device ${GUIDED_DEVICE:-cuda} \
    --steps ${GUIDED_STEPS:-500} --json "$L/guided-device.json" 2>&1 | tee "$L/guided-device.log" | tail -3
  if [ -n "${GUIDED_OLD:-}" ]; then  # the project's own schema, 64 constrained vs 64 plain
    timeout $(left 50) $B service "$ART" $APP ${MBS:+--max-batch-size $MBS} ${XSET:-} --concurrency 1 \
      --guided ${GUIDED:-64} --guided-rounds ${GUIDED_ROUNDS:-3} --deadline $(( $(at 50) - 3 )) \
      --log "$L/server-guided.log" --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-600
  fi
  suite 100
}

# TensorRT-LLM 1.2's decode step for a Mistral-7B-class model (bf16), GPU:streams:step_ms,
# as docs/performance.md derives them ("The serving layer at TensorRT-LLM speeds").
TRT_STEPS=${TRT_STEPS:-a100:64:9.9 a100:256:12.8 h100:64:6.0 h100:256:7.8}
trt_speeds() {  # $1: the last percent of the budget: TRT_RUNS (2) runs of TRT_STEPS, the
  # second in reverse order, each one server start per entry with the defaults (the engine
  # in the server's process, as the TensorRT-LLM kinds serve), both clients, 128 in / 128 out
  local configs=($TRT_STEPS) runs=${TRT_RUNS:-2} first=$(( ($(date +%s) - START) * 100 / PART_BUDGET ))
  local n=0 total=$(( ${#configs[@]} * ${TRT_RUNS:-2} )) run c order
  for run in $(seq 1 $runs); do
    order=("${configs[@]}"); [ $((run % 2)) = 0 ] && order=($(printf '%s\n' "${configs[@]}" | tac))
    for c in "${order[@]}"; do
      n=$((n + 1)); IFS=: read -r gpu streams ms <<< "$c"
      local until=$(( first + ($1 - first) * n / total ))
      echo "{\"figure\": \"next_trt_speed\", \"gpu\": \"$gpu\", \"streams\": $streams, \"step_ms\": $ms, \"run\": $run}" | tee -a "$R"
      [ "$(left $until)" -gt 15 ] || { echo '{"figure": "skipped", "variant": "trt_speed", "why": "out of time"}' | tee -a "$R"; continue; }
      timeout $(left $until) $PY bench/replay_bench.py --context .benchcarry/ctx --concurrency $streams \
        --input-len 128 --output-len 128 --step-ms $ms --client-procs ${CPROCS:-4} \
        --requests-per-worker ${RPW:-4} --port $((8300 + n)) ${TRT_SET:-} $(aiperf_flags) 2>&1 \
        | tee "$L/trt-$gpu-$streams-run$run.txt" | grep -a "^{" \
        | sed "s/^{/{\"trt_gpu\": \"$gpu\", \"run\": $run, /" | tee -a "$R" | cut -c1-400
      cp .cache/replay-bench-server.log "$L/server-trt-$gpu-$streams-run$run.log" 2>/dev/null
    done
  done
}
part_tensorrt-speeds() {
  begin tensorrt-speeds 300
  trt_speeds 100
}

part_round4() {
  # The round's figures in one call (~9 min with the set-up): goal 1's engine and server at
  # R4_LEVELS (c = 16 and 256, 128/128; max_seq_len 1024 so 256 slots fit an 80 GB card),
  # then R4_BURSTS (5) bursts of 16 request starts on that server (bench/burst_ttft.py)
  # (before them: goal 4's start-up phases that are ours, bench/trt_start_phases.py),
  # goal 3's replay runs at TensorRT-LLM's step times (trt_speeds), then goal 2's suite (the
  # first SUITE_SCHEMAS, AIPerf for the first SUITE_AIPERF) at 16 and 64 streams with
  # max_seq_len 4096 (a large schema as a tool's parameters makes a long prompt). Each
  # sub-part stops at its share of the budget: 16% / 23% / 32% / 29%.
  begin round4 ${BUDGET:-450}
  local levels=${R4_LEVELS:-16 256}
  # Goal 4's phases that are ours when TensorRT-LLM serves (CPU only, ~15 s).
  timeout 60 $PY bench/trt_start_phases.py --context .benchcarry/ctx --repeat 3 --hash-mb 1024 \
    --out "$R" 2>&1 | tee "$L/trt-start-phases.txt" | grep -a '_s"\|imports\|hash_gb' | head -12
  timeout $(left 16) $B engine "$ART" --skip-variants --max-batch-size 256 --max-seq-len 1024 \
    ${XSET:-} --concurrency $levels --deadline $(at 16) --out "$R" 2>&1 | tee -a "$L/engine.log" \
    | grep -a '"figure"' | cut -c1-400
  timeout $(left 39) $B service "$ART" $APP --max-batch-size 256 --max-seq-len 1024 ${XSET:-} \
    --concurrency $levels $(aiperf_flags) --burst ${R4_BURSTS:-5} --deadline $(( $(at 39) - 5 )) \
    --log "$L/server-r4.log" --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-600
  snap
  RPW=${R4_RPW:-2} trt_speeds 71
  snap
  MBS=64 XSET="--max-seq-len 4096 ${XSET:-}" SUITE_SCHEMAS=${SUITE_SCHEMAS:-3} \
    SUITE_AIPERF=${SUITE_AIPERF:-1} suite 100
}

part_profile() {
  begin profile 380
  local spy=${SPY:-$(command -v py-spy || echo /tmp/site/bin/py-spy)}
  # .benchcarry/head/ (git archive HEAD mistral-trt-truss/packages), if there: the committed
  # serving code is profiled, not uncommitted work in the tree.
  [ -d .benchcarry/head ] && export BENCH_PACKAGES=$PWD/.benchcarry/head/mistral-trt-truss/packages
  timeout $(left 100) $PY bench/profile_server.py "$ART" $APP --out "$OUT/profile" \
    --pyspy "$spy" --budget $(left 95) ${MBS:+--max-batch-size $MBS --concurrency $MBS} \
    ${LPW:+--long-per-worker $LPW} 2>&1 | grep -v "it/s]" | tee "$L/profile.log"
  gzip -f "$OUT/profile/server.log"
}

# ---- run the parts asked for ----

for P in "$@"; do
  declare -F "part_$P" >/dev/null || { echo "unknown part: $P (see the header: bash $0)"; exit 2; }
done
case " $* " in
  " prepare ") part_prepare; exit ;;
  *" prepare "*) echo "prepare runs alone, on a development machine"; exit 2 ;;
esac
wheels || exit 1
device_env
for P in "$@"; do
  case $P in engine|server|cold|peer|structured|profile|round4) artifact_once ;; esac
  case $P in server|frontends|peer|structured|tensorrt-speeds|round4) aiperf_setup ;; esac
  T0=$(date +%s)
  "part_$P"
  snap; echo "part $P: $(( $(date +%s) - T0 )) s"
done
