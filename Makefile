# Set-up-and-go targets. Each bootstraps .venv when it is missing, with what it needs:
# `make run` torch and the package alone (NumPy, Numba); the others add their extras once.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
# Options for every pip install (a mirror, a proxy); TORCH_INDEX, where set, is the index torch alone comes
# from (PyTorch's CPU-only index, say: a plain `pip install torch` on Linux fetches the CUDA build).
PIP_OPTIONS ?=
TORCH_INDEX ?=
# The extras `make test` installs (pyproject.toml): everything the suite exercises.
TEST_EXTRAS ?= dev
# pytest workers: one per core. Most of a cold run is single-threaded kernel compiles,
# which the workers share through the on-disk cache.
TEST_WORKERS ?= auto
# The modules the API reference documents (`make docs`, into out/api): the package's public
# names, the precision rule, the CPU plan, the MONAI transforms, ONNX export and the golden kit
# (the package's page links each of them).
API_MODULES ?= gridsampler3d gridsampler3d.precision gridsampler3d.cpu.planner gridsampler3d.monai gridsampler3d.onnx gridsampler3d.tools.golden_kit
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install $(PIP_OPTIONS)
STAMP := $(VENV)/.installed
# One stamp per extra installed on top: $(VENV)/.extra-<name>.
EXTRA := $(VENV)/.extra-

.PHONY: venv run demo test lint format bench docs clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	# torch first, pinned, so that nothing below pulls a different (much larger) build
	$(PIP) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	# ... and kept: an extra that would want another torch (monai) resolves to a release that fits
	echo "$(TORCH_SPEC)" > $(VENV)/torch-constraint.txt
	$(PIP) -c $(VENV)/torch-constraint.txt -e .
	rm -f $(EXTRA)*
	touch $(STAMP)

# An extra of pyproject.toml on top of the package, once (the stamp goes when the package is reinstalled).
$(EXTRA)%: $(STAMP)
	$(PIP) -c $(VENV)/torch-constraint.txt -e ".[$*]"
	touch $@

run: venv
	$(VENV)/bin/gridsampler3d run --out out/run

demo: $(EXTRA)bench
	$(VENV)/bin/gridsampler3d demo --out out/demo

# --dist worksteal: a worker that runs out takes tests waiting in another's queue (tests/conftest.py starts the
# slow ones first); --durations: the slowest tests, listed at the end of the run
test: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=25 tests

# The linter and the formatter's check (ruff, configured in pyproject.toml); `make format` fixes what they can.
lint: $(EXTRA)$(TEST_EXTRAS)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(EXTRA)$(TEST_EXTRAS)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: $(EXTRA)bench
	$(VENV)/bin/gridsampler3d bench --json out/bench.json --plot out/bench.png

# The docstrings are Google style (Args:, Returns:); tests/test_docs.py builds the same, without a warning.
docs: $(EXTRA)docs
	$(PY) -m pdoc --docformat google --output-directory out/api $(API_MODULES)

clean:
	rm -rf $(VENV) out .pytest_cache
