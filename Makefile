# Set-up-and-go targets. Each bootstraps .venv when it is missing.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev
# pytest workers: one per core. Most of a cold run is single-threaded kernel compiles,
# which the workers share through the on-disk cache.
TEST_WORKERS ?= auto
# The modules the API reference documents (`make docs`, into out/api): the package's public
# names, and the plan, the precision rule and the golden kit.
API_MODULES ?= gridsampler3d gridsampler3d.cpu.planner gridsampler3d.precision gridsampler3d.golden_kit
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv run demo test lint format bench docs clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	# torch first, pinned, so that nothing below pulls a different (much larger) build
	$(PY) -m pip install "$(TORCH_SPEC)"
	# ... and kept: an extra that would want another torch (monai) resolves to a release that fits
	echo "$(TORCH_SPEC)" > $(VENV)/torch-constraint.txt
	$(PY) -m pip install -c $(VENV)/torch-constraint.txt -e ".[$(EXTRAS)]"
	touch $(STAMP)

run: venv
	$(VENV)/bin/gridsampler3d run --out out/run

demo: venv
	$(VENV)/bin/gridsampler3d demo --out out/demo

test: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) tests

# The linter and the formatter's check (ruff, configured in pyproject.toml); `make format` fixes what they can.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: venv
	$(VENV)/bin/gridsampler3d bench --json out/bench.json --plot out/bench.png

docs: venv
	$(PY) -m pdoc --output-directory out/api $(API_MODULES)

clean:
	rm -rf $(VENV) out .pytest_cache
