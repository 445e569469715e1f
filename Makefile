# Two commands do all the set-up on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PORT ?= 8080
DEV_MODEL := .cache/dev-model/build_manifest.json

.PHONY: venv dev-model serve test test-unit test-e2e lint bench clean

venv: $(STAMP)

# The Truss server's own requirements come from the installed truss package, so the
# local server runs with exactly what the image installs.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -c "import truss, pathlib; d = pathlib.Path(truss.__file__).parent / 'templates/server'; \
	  pathlib.Path('$(VENV)/server-requirements.txt').write_text(''.join(l for l in (d / 'requirements.txt').open() if not l.startswith('-i')))"
	$(PY) -m pip install -q -r $(VENV)/server-requirements.txt \
	  -c $$($(PY) -c "import truss, pathlib; print(pathlib.Path(truss.__file__).parent / 'templates/server/constraints.txt')")
	touch $(STAMP)

$(DEV_MODEL): $(STAMP)
	$(PY) build.py dev-model

dev-model: $(DEV_MODEL)

serve: $(DEV_MODEL)
	$(PY) build.py serve --port $(PORT)

test: $(DEV_MODEL)
	$(PY) -m ruff check .
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: $(DEV_MODEL)
	$(PY) tests/bench/concurrency.py

clean:
	rm -rf $(VENV) .cache
