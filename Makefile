# The two commands of the README. Both set up everything on a fresh machine first.
#   make demo   the main job on the built-in example pair (CPU, no GPU needed): every stage, the demo
#               prompts, then it serves until Ctrl-C (make demo UP_FLAGS=--once stops after the prompts)
#   make test   the test suite
VENV    ?= .venv
PYTHON  ?= python3
BIN     := $(VENV)/bin
DEMO    := .demo
UP_FLAGS ?=            # e.g. UP_FLAGS=--once to stop the server after the demo prompts

.PHONY: setup demo test lint format clean-demo cli-docs soak

setup: $(VENV)/.installed

# CPU PyTorch first: a plain `pip install torch` gets the CUDA build on Linux (several GB), so
# scripts/install_torch.py installs it from PyTorch's CPU wheel index where the platform has one, and
# from the default index (pip's configuration, cache) with a printed note when it has none or that index
# does not answer. Then specbuild with all extras. pip prints what it does: minutes of work, not silence.
$(VENV)/.installed: pyproject.toml scripts/install_torch.py
	$(PYTHON) -m venv $(VENV)
	@echo "setup: installing pip, CPU PyTorch, then specbuild with all extras into $(VENV) (a few minutes)"
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python scripts/install_torch.py "torch==2.13.*"
	$(BIN)/python -m pip install --progress-bar off -e ".[all]"
	touch $@

demo: setup
	$(BIN)/specbuild init --example --out $(DEMO)/specbuild.toml --force
	$(BIN)/specbuild up -c $(DEMO)/specbuild.toml $(UP_FLAGS)

# Two workers (pytest-xdist), a test file's tests on one worker (their module's server is started once): the suite
# spends more time waiting on servers than computing, so two workers on two cores take about 0.75x the time of
# one. Files go out in collection order, where tests/conftest.py puts those with a slow test first (xdist's own order,
# most tests first, left the one-test soak for the end). `make test TEST_WORKERS=0` runs it in one process.
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

# ruff over the whole tree (its settings: pyproject.toml [tool.ruff]); `make format` rewrites what `make lint` refuses
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

cli-docs: setup
	$(BIN)/python scripts/cli_reference.py --write

clean-demo:
	rm -rf $(DEMO)

# The convert tests again under the library versions TensorRT-LLM 1.2 pins in its requirements.txt
# (NVIDIA/TensorRT-LLM requirements.txt: nvidia-modelopt[torch]~=0.37.0, transformers 4.57.x): the GPU
# image converts with those, not with the newer ones in .venv. Same CPU torch as .venv (a PyPI torch
# would pull the CUDA build). The import check fails loudly instead of letting the tests skip.
PINS_VENV ?= .venv-convert-pins
CONVERT_PINS := "nvidia-modelopt[torch]~=0.37.0" "transformers==4.57.1"

.PHONY: test-convert-pins
test-convert-pins: $(PINS_VENV)/.installed
	$(PINS_VENV)/bin/python -c 'import modelopt, transformers, modelopt.torch.quantization, modelopt.torch.export; \
	  print("modelopt", modelopt.__version__, "transformers", transformers.__version__); \
	  assert modelopt.__version__.startswith("0.37.") and transformers.__version__.startswith("4.57."), "wrong pins"'
	timeout 1200 $(PINS_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_convert_cli.py \
	  tests/test_convert_fixups.py tests/test_convert_loader.py tests/test_convert_vocab.py

$(PINS_VENV)/.installed: pyproject.toml Makefile scripts/install_torch.py
	$(PYTHON) -m venv $(PINS_VENV)
	$(PINS_VENV)/bin/python -m pip install --quiet --upgrade "pip>=24"
	$(PINS_VENV)/bin/python scripts/install_torch.py "torch==2.13.*"
	$(PINS_VENV)/bin/python -m pip install --quiet -e ".[ml,test]" $(CONVERT_PINS)
	touch $@

# The exactness tests under each CPU kernel selection this machine can emulate (docs/runtime.md, Exactness).
.PHONY: test-kernels
test-kernels: setup
	$(BIN)/python scripts/kernel_matrix.py

# The tests whose expectations depend on the CPU cores the code sees (overlap "auto", the BLS's schedule under
# load), under 2, 8 and 64 cores: SPECBUILD_CORES overrides what speculative.overlap.available_cores() reads.
CORES_TESTS := tests/test_speculative_overlap.py tests/test_bls_server.py tests/test_generate_cli.py \
	tests/test_bench_tiny.py tests/test_drafters.py
.PHONY: test-cores
test-cores: setup
	for cores in 2 8 64; do echo "== SPECBUILD_CORES=$$cores"; \
	  SPECBUILD_CORES=$$cores $(BIN)/python -m pytest -q $(CORES_TESTS) || exit 1; done

# Mutation testing of the core (mutmut, installed into the venv here; a copy of the tree is mutated, never this one):
# the runs are in docs/mutation/results.json, the equivalent survivors' reasons in docs/mutation/equivalents.toml,
# the report is docs/mutation.md. FILES="speculative/lookup.py ..." narrows it (paths under pipeline/specbuild).
.PHONY: mutation
# The chaos soak (scripts/soak.py; docs/triton.md, "The chaos soak") on the example's repository, made first by
# `make demo UP_FLAGS=--once` where it is not there. SOAK_FLAGS="--minutes 5" shortens it.
SOAK_FLAGS ?= --minutes 30 --streams 4 --fault-every 20
soak: setup
	test -f $(DEMO)/specbuild.toml || $(MAKE) demo UP_FLAGS=--once
	$(BIN)/python scripts/soak.py -c $(DEMO)/specbuild.toml $(SOAK_FLAGS)

mutation: setup
	$(BIN)/python scripts/mutation.py $(if $(FILES),--files $(FILES))
