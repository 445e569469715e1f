#!/usr/bin/env bash
# The wheels AIPerf 0.13.0 needs on the H200 image and the image lacks: AIPerf's runtime
# closure (pip's resolution of aiperf==0.13.0 under tests/tools/requirements.txt, Linux,
# CPython 3.12) less the packages the image already has.
# Versions come from tests/tools/requirements.txt (the pins live there only).
#
#   bash bench/tool_wheels.sh DIR [--lean]   # DIR/*.whl, then their count and total size
#
# --lean leaves out what `aiperf profile` (synthetic prompts, streamed completions, no UI)
# never imports, checked by running it with those modules made unimportable: the plot and
# dashboard stack (plotly, dash, kaleido), optuna and its SQLAlchemy, the Kubernetes
# operator (kopf), datasets and flask: about half of the size.
#
# On the device (no network): unzip every wheel into one folder and put it on PYTHONPATH:
#   mkdir -p /tmp/ap && for w in DIR/*.whl; do python3 -m zipfile -e "$w" /tmp/ap; done
#   PYTHONPATH=/tmp/ap python3 -m aiperf --version    # prints 0.13.0
# For gpu_bench.py --aiperf (bench/run_gpu.sh does this), only AIPerf's python gets that path (the folder holds fastapi,
# starlette and pydantic of their own, which must not reach the server):
#   printf '#!/bin/sh\nPYTHONPATH=/tmp/ap exec python3 "$@"\n' > /tmp/aiperf-py
#   chmod +x /tmp/aiperf-py && export AIPERF_PY=/tmp/aiperf-py
set -euo pipefail
dest=${1:?usage: tool_wheels.sh DIR [--lean]}
lean=${2:-}
here=$(cd "$(dirname "$0")/.." && pwd)
pins=$here/tests/tools/requirements.txt

# Not in the image: AIPerf and the rest of its closure (names as PEP 503 normalises them).
missing="aiosqlite aiperf alembic annotated-types blinker brotli cffi choreographer colorlog
crick cyclopts dash dash-bootstrap-components datasets dill docstring-parser fastapi
ffmpeg-python flask future importlib-metadata iso8601 itsdangerous jmespath jsonpatch
jsonpointer kaleido kopf kubernetes-asyncio lazy-importer logistro mako msgspec multiprocess
nest-asyncio opentelemetry-api optuna orjson platformdirs plotly pycparser pydantic
pydantic-core pydantic-settings python-dotenv python-json-logger python-multipart pytz pyzmq
retrying rich-rst ruamel-yaml ruamel-yaml-clib setproctitle soundfile sqlalchemy starlette
starlette-compress textual typing-inspection tzdata uvicorn zstandard"

unused="plotly dash dash-bootstrap-components kaleido choreographer optuna sqlalchemy alembic
kopf kubernetes-asyncio datasets flask"
specs=()
for name in $missing; do
  if [ "$lean" = --lean ] && [[ " $(echo $unused) " == *" $name "* ]]; then continue; fi
  # The pin whose name normalises (lower case, runs of -_. as -) to $name.
  pin=$(awk -v want="$name" '!/^#/ { n = tolower($0); sub(/==.*/, "", n); gsub(/[-_.]+/, "-", n)
    if (n == want) print }' "$pins")
  [ -n "$pin" ] || { echo "no pin for $name in $pins" >&2; exit 1; }
  specs+=("$pin")
done

mkdir -p "$dest"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d "$dest" "${specs[@]}"
ls "$dest"/*.whl | wc -l | xargs echo wheels:
du -sh "$dest" | cut -f1 | xargs echo total:
