#!/usr/bin/env bash
# `make test-compat` on the GPU machine: the same serving unit tests under TensorRT-LLM
# 1.2.1's pins, on Python 3.12 (the release image's; not installable on the dev machines).
# That machine has Python 3.12.3 and torch 2.11 but no registry, and a device call carries
# at most 64 MiB, so the wheels travel in two parts (bench/compat_py312/wheels-*.txt,
# ~58 + ~18 MiB) and are installed into .venv-compat312/site (ignored; it stays while the
# machine is warm), ahead of the machine's own packages on PYTHONPATH. torch and triton
# are the machine's (the compat venv deviates on torch too: mistral_build.image).
#
#   here:   bench/run_compat_py312.sh download a     # .whl/ <- part a (cp312 wheels;
#           PYVER=3.11 for a rehearsal here with PY=.venv/bin/python)
#   device: bash bench/run_compat_py312.sh install   # carry .whl
#   here:   bench/run_compat_py312.sh download b
#   device: bash bench/run_compat_py312.sh install && bash bench/run_compat_py312.sh test
#
# `test` builds the dev model with these pins' transformers (.venv-compat312/dev-model)
# and runs COMPAT_TESTS (the same globs as the Makefile; tests/unit/test_requirements_compat.py
# holds them equal). Its output (and junit XML) also goes to $OUT when set.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
HERE=bench/compat_py312
SITE=.venv-compat312/site
COMPAT_TESTS=(tests/unit/test_tokenizer*.py tests/unit/test_chat*.py
  tests/unit/test_detokenizer*.py tests/unit/test_streaming*.py tests/unit/test_server.py
  tests/unit/test_frontend*.py tests/unit/test_protocol_*.py tests/unit/test_artifacts*.py)

case "${1:-}" in
download)  # on the dev machine (registry access): one part into .whl/, checked for size
  part=${2:?download a|b}
  rm -rf .whl && mkdir .whl
  pip download -q --no-deps --python-version "${PYVER:-3.12}" --only-binary=:all: \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
    -d .whl -r "$HERE/wheels-$part.txt"
  size=$(du -sm --apparent-size .whl | cut -f1)
  echo "part $part: $(ls .whl | wc -l) wheels, ${size} MiB in .whl/"
  [ "$size" -le 64 ] || { echo "over the 64 MiB a device call carries"; exit 1; }
  ;;
install)  # on the GPU machine: whatever part lies in .whl/
  ls .whl/*.whl > /dev/null
  mkdir -p "$SITE"
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" .whl/*.whl
  echo "installed $(ls .whl | wc -l) wheels into $SITE"
  ;;
test)
  # As in .venv-compat, no GGUF reader even if the machine has one: SmolLM2's files are
  # built by the dev venv (transformers 5); without them (.cache/smollm2) those tests skip.
  mkdir -p .venv-compat312/nogguf/gguf
  echo 'raise ModuleNotFoundError("no GGUF reader in the compat run", name="gguf")' > .venv-compat312/nogguf/gguf/__init__.py
  # The machine's scipy, scikit-learn, jax, ... need numpy 2 and would break transformers' imports
  # under numpy<2; the release image has neither problem, and no test needs them.
  echo 'import sys; sys.modules.update(dict.fromkeys(["sklearn", "scipy", "jax", "jaxlib", "flax", "optax", "tensorflow", "keras", "tf_keras", "pandas", "librosa", "cv2"]))' > .venv-compat312/nogguf/sitecustomize.py
  export USE_TORCH=1 USE_TF=0 USE_FLAX=0 USE_JAX=0
  export PYTHONPATH="$PWD/$SITE:$PWD/.venv-compat312/nogguf" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
  export MISTRAL_DEV_MODEL_DIR="$PWD/.venv-compat312/dev-model"
  $PY -c "import sys; from importlib.metadata import version as v; print(sys.version.split()[0], *(f'{p} {v(p)}' for p in ('torch', 'transformers', 'mistral-common', 'fastapi', 'starlette', 'numpy', 'xgrammar', 'huggingface_hub')), sep=', ')"
  # Every wheel of both parts must be there and win over the machine's own copy.
  $PY - "$HERE"/wheels-*.txt <<'EOF'
import sys
from importlib.metadata import version
wrong = []
for path in sys.argv[1:]:
    for line in open(path):
        line = line.split("#")[0].strip()
        if line:
            name, want = line.split("==")
            have = version(name)
            if have != want:
                wrong.append(f"{name} {have} (want {want})")
sys.exit("not the compat pins: " + ", ".join(wrong) if wrong else 0)
EOF
  $PY build.py dev-model --force --out "$MISTRAL_DEV_MODEL_DIR"
  junit=()
  [ -n "${OUT:-}" ] && junit=(--junitxml "$OUT/compat-py312.xml")
  $PY -m pytest -q -p no:cacheprovider "${junit[@]}" "${COMPAT_TESTS[@]}" 2>&1 |
    tee ${OUT:+"$OUT/compat-py312.log"}
  ;;
*)
  sed -n '2,20p' "$0"
  exit 2
  ;;
esac
