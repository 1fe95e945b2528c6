# Quick start: `make demo` (set up and run the main job on a bundled example), `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# torch: these machines install 2.13.0 from a local file; bring your own build with TORCH_SPEC
# (e.g. TORCH_SPEC="torch==2.4.1") or install torch into the venv first and set TORCH_SPEC="".
TORCH_SPEC ?= torch==2.13.0
# The torch that torch_mlu r2.4 pairs with: `make test-torch24` runs the whole suite on it in its own venv.
TORCH24_SPEC ?= torch==2.4.1
OUT    ?= out/demo
# pytest-xdist workers for `make test`: one per core, at most 4 (each imports torch; most tests start audit children
# that import it again). A test file stays on one worker (its module fixtures run once); TEST_JOBS=0 runs in-process.
TEST_JOBS ?= auto

# The Triton kernels under Triton's CPU interpreter (tests/test_triton_interpret.py) in their own venv: the GPU
# machine's Triton and a numpy its interpreter runs with (the other venvs have no Triton, or torch 2.4.1's 3.0.0).
TRITON_VENV ?= .venv-triton
TRITON_SPEC ?= triton==3.6.0
INTERPRET_NUMPY_SPEC ?= numpy<2.4

.PHONY: setup demo test test-torch24 test-triton-interpret bench lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools
	$(if $(TORCH_SPEC),$(PY) -m pip install -q "$(TORCH_SPEC)")
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

# The main job: audit a CUDA training script for the MLU (static findings + patch, then a real run on
# this machine's device with every op captured and its MLU support predicted).
demo: setup
	$(VENV)/bin/hal backends
	$(VENV)/bin/hal-audit examples/cuda_train.py --device mlu --fix --out $(OUT)

test: setup
	$(VENV)/bin/ruff check hal backends models conformance tests benchmarks
	$(PY) -m pytest -q -n $(TEST_JOBS) --maxprocesses 4 --dist loadfile

# The suite again on torch 2.4 (PyPI's 2.4.1 is a CUDA build that runs on the CPU; about 5 GB in .venv-torch24).
test-torch24:
	$(MAKE) VENV=.venv-torch24 TORCH_SPEC="$(TORCH24_SPEC)" test

# Fails, rather than skips, where Triton or that numpy is missing (HAL_REQUIRE_BACKENDS, tests/conftest.py).
test-triton-interpret:
	$(MAKE) VENV=$(TRITON_VENV) setup
	$(TRITON_VENV)/bin/python -m pip install -q "$(TRITON_SPEC)" "$(INTERPRET_NUMPY_SPEC)"
	HAL_REQUIRE_BACKENDS=triton-interpret $(TRITON_VENV)/bin/python -m pytest -q -rs -n $(TEST_JOBS) --maxprocesses 4 \
	    tests/test_triton_interpret.py

lint: setup
	$(VENV)/bin/ruff check hal backends models conformance tests benchmarks

clean:
	rm -rf $(VENV) .venv-torch24 $(TRITON_VENV) out .pytest_cache
