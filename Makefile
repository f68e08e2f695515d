# Set-up and the everyday jobs. `make demo` and `make test` create .venv on first use.
#
#   TORCH=...      the torch requirement installed first (default: the 2.13.0 CPU build where a
#                  local wheel provides it). On a GPU machine use `make TORCH=torch ...`.
#   EXTRAS=...     package extras (default: dev,metaworld; Meta-World pins mujoco 3.3.0, so it is
#                  installed from the start rather than switched in place later).
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
EXTRAS ?= dev,metaworld
BIN := $(VENV)/bin
export MUJOCO_GL ?= egl

.PHONY: install demo test lint format bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install "$(TORCH)"
	# Keep the torch just installed: a dependency asking for torch must not pull another build.
	$(BIN)/python -c "import torch; print('torch==' + torch.__version__)" > $(VENV)/constraints.txt
	$(BIN)/python -m pip install -c $(VENV)/constraints.txt -e ".[$(EXTRAS)]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/embodied demo configs/demo.yaml

# Lint, then the test suite. pytest's exit code 5 (no tests collected) is a failure here.
test: install lint
	$(BIN)/python -m pytest -q; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi; exit $$rc

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install
	$(BIN)/embodied bench sim

clean:
	rm -rf $(VENV) build *.egg-info
