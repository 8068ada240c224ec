# The two commands of the README. Both set up everything on a fresh machine first.
#   make demo   the main job on the built-in example pair (CPU, no GPU needed): every stage, the demo
#               prompts, then it serves until Ctrl-C (make demo UP_FLAGS=--once stops after the prompts)
#   make test   the test suite
VENV    ?= .venv
PYTHON  ?= python3
BIN     := $(VENV)/bin
DEMO    := .demo
UP_FLAGS ?=            # e.g. UP_FLAGS=--once to stop the server after the demo prompts

.PHONY: setup demo test clean-demo cli-docs

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

test: setup
	$(BIN)/python -m pytest -q

cli-docs: setup
	$(BIN)/python scripts/cli_reference.py --write

clean-demo:
	rm -rf $(DEMO)
