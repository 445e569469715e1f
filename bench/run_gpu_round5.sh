#!/usr/bin/env bash
# Round 5's device calls (H200). PART=a (~8 min): artifact (7B-shaped, random bf16) ->
#   in-process engine 128/128 at c = 1/16/64/256 with chunked prefill off and 2048 (each
#   sweep twice)
#   -> the real server (chunked prefill off, then 2048): the project's client (raw, 4
#   processes) and guidellm 0.8.1 (an independent load generator) at the same levels.
# PART=b (~8 min): 64 constrained chat streams (nested-object json_schema) vs 64 plain ones,
#   twice, with the batched masks and then row by row (guided_batch_mask=false); start ->
#   ready phases (cold_start.py) with the whole page cache dropped, twice; the server runs
#   again (the second run of each server figure).
# Prepared as in docs/performance.md ("Round 5: commands"): .whl/ (server + xgrammar +
# guidellm wheels), .benchcarry/ctx/app, .benchcarry/tok.
# Usage (device tool, carry [".whl", ".benchcarry"]): PART=a bash bench/run_gpu_round5.sh
set -u -o pipefail
BUDGET=${BUDGET:-540}
source bench/gpu_env.sh
CHUNKS=${CHUNKS:-2048}
SRV_CHUNK=${SRV_CHUNK:-2048}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; free -g | head -2
  $PY -c 'import torch, xgrammar, guidellm, importlib.metadata as m; print("torch", torch.__version__, "xgrammar", m.version("xgrammar"), "guidellm", m.version("guidellm"))'
} 2>&1 | tee "$OUT/env.txt"
$B make-artifact "$ART" --tokenizer-from .benchcarry/tok ${TINY:+--tiny} --out "$R" 2>&1 | grep -v "it/s]" | tail -3

engines() {  # $1: the last percent of the budget the engine runs may use
  for C in 0 $CHUNKS; do
    timeout $(left $1) $B engine "$ART" --skip-variants ${MBS:+--max-batch-size $MBS} ${LEVELS:+--concurrency $LEVELS} \
      --set prefill_chunk_tokens=$C ${XSET:-} --repeat 2 --deadline $(at $1) --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-400
  done
}
servers() {  # $1: the last percent of the budget
  for C in 0 $SRV_CHUNK; do
    timeout $(left $1) $B service "$ART" .benchcarry/ctx/app ${MBS:+--max-batch-size $MBS} ${LEVELS:+--concurrency $LEVELS} \
      --set prefill_chunk_tokens=$C ${XSET:-} --guidellm --deadline $(( $(at $1) - 5 )) --log "$L/server-$C-$RANDOM.log" \
      --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-600
    snap
  done
}
if [ "${PART:-a}" = a ]; then
  engines 40; servers 100
else
  for M in true false; do  # batched masks (this round) vs row by row (before)
    timeout $(left $([ $M = true ] && echo 30 || echo 50)) $B service "$ART" .benchcarry/ctx/app ${MBS:+--max-batch-size $MBS} \
      --concurrency 1 --set guided_batch_mask=$M ${XSET:-} --guided ${GUIDED:-64} --guided-rounds 2 \
      --deadline $(( $(at $([ $M = true ] && echo 30 || echo 50)) - 3 )) --log "$L/server-guided-$M.log" \
      --out "$R" 2>&1 | grep -a '"figure"' | cut -c1-600
    snap
  done
  for I in 1 2; do timeout $(left 60) $PY bench/cold_start.py "$ART" --evict ${EVICT:-all} ${MBS:+--max-batch-size $MBS} --out "$R"; done
  SRV_CHUNK= servers 100  # the second run of the default server's figures
fi
snap; echo "total $(( $(date +%s) - START )) s"
