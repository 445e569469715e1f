#!/usr/bin/env bash
# The request start's cost, before and after a change, on this machine's CPU: the replay
# engine (no model) behind the real server, the second checkout's `bench/replay_bench.py`
# serving each checkout's packages in alternate order, PAIRS times at each prompt length,
# one JSON line per run in $OUT/pairs.jsonl (each line's "tree" and "pair" say which). Short outputs (4 tokens) make the starts most of
# the server's work; the line's server_cpu_s over its requests is the CPU per request.
#
#   git worktree add /tmp/before <commit>
#   PAIRS=3 OUT=/tmp/pairs bash bench/replay_pairs.sh /tmp/before .   # ~4 min (~10 with AIPerf)
#
# PY (default .venv/bin/python of the second tree), LENGTHS ("16 1024"), CONC (256),
# RPW (requests per stream, 8), STEP_MS (16), EXTRA (more replay_bench.py flags: `--aiperf
# --aiperf-token-ids` adds AIPerf, AIPERF_PY, in the same server start with our client's
# token-id bodies, and the server's CPU over AIPerf's run as an "aiperf_server" line).
set -euo pipefail
before=$(cd "$1" && pwd) after=$(cd "$2" && pwd)
PY=${PY:-$after/.venv/bin/python} PAIRS=${PAIRS:-5} OUT=${OUT:?set OUT}
LENGTHS=${LENGTHS:-"16 1024"} CONC=${CONC:-256} RPW=${RPW:-8} STEP_MS=${STEP_MS:-16}
mkdir -p "$OUT"
export PATH="$(dirname "$PY"):$PATH"
# One benchmark (the second tree's) and one build context for both: only the serving
# packages the server imports differ.
CTX=$OUT/ctx
if [ ! -d "$CTX/server" ]; then
  (cd "$after" && PYTHONPATH=mistral-trt-truss/packages "$PY" -c "import sys; from pathlib import Path
from mistral_build.local_server import render_build_context, prepare_app_dir
prepare_app_dir(render_build_context(Path(sys.argv[1]).resolve()))" "$CTX") >/dev/null
  rm -rf "$CTX/packages"  # the server imports --packages instead
fi
run() {  # tree-name tree-dir pair input-len
  (cd "$after" && "$PY" bench/replay_bench.py --context "$CTX" --packages "$2/mistral-trt-truss/packages" \
    --concurrency "$CONC" --input-len "$4" --output-len 4 --requests-per-worker "$RPW" \
    --step-ms "$STEP_MS" ${EXTRA:-}) \
    | grep '^{' | "$PY" -c "import json,sys
for line in sys.stdin:
    r = json.loads(line); r.pop('host', None)
    r.update(tree='$1', pair=$3, client=r.get('figure', 'ours'), input_len=$4)
    print(json.dumps(r))" >> "$OUT/pairs.jsonl"
}
for pair in $(seq 1 "$PAIRS"); do
  for len in $LENGTHS; do
    if (( pair % 2 )); then order="before after"; else order="after before"; fi
    for tree in $order; do
      if [[ $tree == before ]]; then dir=$before; else dir=$after; fi
      run "$tree" "$dir" "$pair" "$len"
    done
  done
done
"$PY" - "$OUT/pairs.jsonl" <<'PYEOF'
import collections, json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = collections.defaultdict(list)
for r in rows:
    by[(r["input_len"], r["client"], r["tree"])].append(r)
def span(values, form):
    v = sorted(x for x in values if x is not None)
    return f"{v[0]:{form}}-{v[-1]:{form}}" if v else "-"
for (n, client, tree), rs in sorted(by.items()):
    cpu = span((1000 * r["server_cpu_s"] / r["requests"] if "server_cpu_s" in r else None
                for r in rs), ".3f")
    print(f"in={n:5d} {client:6s} {tree:6s} runs={len(rs)} server ms/request {cpu}"
          f"  tok/s {span((r.get('output_tok_s') for r in rs), '.0f')}"
          f"  TTFT p50 {span((r.get('ttft_ms_p50') for r in rs), '.0f')} ms")
PYEOF
