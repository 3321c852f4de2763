# The two commands (README): `make demo` runs the embedded default end to end; `make test` runs
# the tests. Both create .venv and install everything on a fresh machine.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CORES ?= 2
# PyTorch CPU wheel installed when the venv has no torch yet. GPU users: create .venv and install
# their CUDA build of torch into it first (see README); it is kept.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: demo test venv lint format clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/activate pyproject.toml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(BIN)/snakemake --profile profiles/default --cores $(CORES)
	@echo
	@echo "Figures:"
	@ls -1 results/*/figures/*.png results/*/figures/*.pdf
	@echo "Tables: results/*/tables/*.csv   Logs: results/*/logs/"

test: venv
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check src scripts tests benchmarks
	$(BIN)/ruff format --check src scripts tests benchmarks
	$(BIN)/snakefmt --check Snakefile rules
	$(BIN)/snakemake --lint

format: venv
	$(BIN)/ruff format src scripts tests benchmarks
	$(BIN)/snakefmt Snakefile rules

clean:
	rm -rf results .snakemake
