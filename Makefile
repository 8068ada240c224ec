# The two commands of the README. Both set up everything on a fresh machine first.
#   make demo   the main job on the built-in example pair (CPU, no GPU needed)
#   make test   the test suite
VENV    ?= .venv
PYTHON  ?= python3
BIN     := $(VENV)/bin
DEMO    := .demo
UP_FLAGS ?=            # e.g. UP_FLAGS=--once to stop the server after the demo prompts

.PHONY: setup demo test clean-demo cli-docs

setup: $(VENV)/.installed

# CPU PyTorch first (a plain `torch` would pull a multi-GB CUDA build), then specbuild with all extras.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python -m pip install --quiet "torch==2.13.*"
	$(BIN)/python -m pip install --quiet -e ".[all]"
	touch $@

demo: setup
	$(BIN)/specbuild init --example --out $(DEMO)/specbuild.toml --force
	$(BIN)/specbuild up -c $(DEMO)/specbuild.toml $(UP_FLAGS)

test: setup
	$(BIN)/python -m pytest -q

cli-docs: setup
	$(BIN)/python scripts/cli_reference.py --write

clean-demo:
	rm -rf $(DEMO)

# The exactness tests under each CPU kernel selection this machine can emulate (docs/runtime.md, Exactness).
.PHONY: test-kernels
test-kernels: setup
	$(BIN)/python scripts/kernel_matrix.py
