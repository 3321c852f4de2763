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

.PHONY: demo test venv lint docs format clean slurm-profile

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)

# The torch now installed is a constraint of everything else: no dependency may replace it (an
# unpinned torch pulls gigabytes of CUDA wheels onto a CPU machine, or a CPU wheel over a CUDA build).
# The other packages: the versions the tests ran with, as pinned in envs/*.yaml (the conda
# environments of `--sdm conda`), so that every fresh install is the tested one.
$(VENV)/.installed: $(BIN)/activate pyproject.toml envs/epochlens.yaml envs/plots.yaml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -c "import torch; print('torch==' + torch.__version__)" > $(VENV)/constraints.txt
	$(BIN)/python envs/pip_constraints.py envs/*.yaml >> $(VENV)/constraints.txt
	$(BIN)/python -m pip install --quiet -e ".[dev]" -c $(VENV)/constraints.txt
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(BIN)/snakemake --profile profiles/default --cores $(CORES)
	@echo
	@echo "Figures:"
	@ls -1 results/*/figures/*.png results/*/figures/*.pdf
	@echo "Tables: results/*/tables/*.csv   Logs: results/*/logs/"
	@echo
	@echo "Sample explorers (a static page per run; serve one on 127.0.0.1 with the command after it):"
	@for d in results/*/samples/explorer; do [ -d "$$d" ] || continue; \
		run=$$(basename $$(dirname $$(dirname $$d))); echo "  $$d/index.html    $(BIN)/epochlens explore $$run"; \
	done

# One pytest worker per core (pytest-xdist), a test module per worker at a time (its finished tiny
# runs are shared by its tests), the slowest modules first (tests/conftest.py).
test: venv
	$(BIN)/python -m pytest -n $(CORES) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check src scripts tests benchmarks docs
	$(BIN)/ruff format --check src scripts tests benchmarks docs
	$(BIN)/snakefmt --check Snakefile rules
	$(BIN)/snakemake --lint
	$(BIN)/python docs/_tools/generate.py --check
	$(BIN)/python -m sphinx -W --keep-going -q -b html docs docs/_build/html

# The docs site (docs/, Sphinx + MyST + Furo): the reference pages regenerated from the code, then
# the site built with warnings as errors into docs/_build/html (open its index.html).
docs: venv
	$(BIN)/python docs/_tools/generate.py
	$(BIN)/python -m sphinx -W --keep-going -b html docs docs/_build/html

format: venv
	$(BIN)/ruff format src scripts tests benchmarks docs
	$(BIN)/snakefmt Snakefile rules

# The SLURM profile where the bare `snakemake --profile slurm` finds it (~/.config/snakemake/slurm),
# with your partition and account when given (both optional: without them the plugin uses the
# cluster's default partition and guesses the account):
#   make slurm-profile SLURM_PARTITION=gpu SLURM_ACCOUNT=mylab
# An existing profile that differs is kept as config.yaml.bak.
SLURM_PROFILE_DIR ?= $(or $(XDG_CONFIG_HOME),$(HOME)/.config)/snakemake/slurm
SLURM_PARTITION ?=
SLURM_ACCOUNT ?=

slurm-profile:
	mkdir -p "$(SLURM_PROFILE_DIR)"
	sed $(if $(SLURM_PARTITION),-e "s|^  # slurm_partition: .*|  slurm_partition: \"'$(SLURM_PARTITION)'\"|") \
	    $(if $(SLURM_ACCOUNT),-e "s|^  # slurm_account: .*|  slurm_account: \"'$(SLURM_ACCOUNT)'\"|") \
	    profiles/slurm/config.yaml > "$(SLURM_PROFILE_DIR)/config.yaml.new"
	@if [ -f "$(SLURM_PROFILE_DIR)/config.yaml" ] && ! cmp -s "$(SLURM_PROFILE_DIR)/config.yaml" "$(SLURM_PROFILE_DIR)/config.yaml.new"; then \
	    mv "$(SLURM_PROFILE_DIR)/config.yaml" "$(SLURM_PROFILE_DIR)/config.yaml.bak"; \
	    echo "kept your previous profile as $(SLURM_PROFILE_DIR)/config.yaml.bak"; fi
	mv "$(SLURM_PROFILE_DIR)/config.yaml.new" "$(SLURM_PROFILE_DIR)/config.yaml"
	@echo "installed: snakemake --profile slurm (partition: $(or $(SLURM_PARTITION),cluster default), account: $(or $(SLURM_ACCOUNT),guessed))"

clean:
	rm -rf results .snakemake docs/_build
