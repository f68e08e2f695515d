# Set-up and the everyday jobs. `make demo` and `make test` create .venv on first use.
#
#   TORCH=...      the torch requirement installed first (default: the 2.13.0 CPU build where a
#                  local wheel provides it). On a GPU machine use `make TORCH=torch ...`.
#   EXTRAS=...     package extras (default: dev,metaworld,distributed; Meta-World pins mujoco 3.3.0, so it is
#                  installed from the start rather than switched in place later).
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
EXTRAS ?= dev,metaworld,distributed
BIN := $(VENV)/bin
export MUJOCO_GL ?= egl

# A second environment without the Meta-World extra gets the newest MuJoCo: the suite must run
# on both (Meta-World pins 3.3.0, and one environment must never switch MuJoCo versions in place).
LATEST := .venv-mujoco-latest

.PHONY: install demo test test-suite test-fast test-mujoco-latest lint format bench clean

# $(call venv,DIR,EXTRAS): create DIR with torch first, pinned by a constraints file, then the package.
define venv
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -c "import torch" 2>/dev/null || $(1)/bin/python -m pip install "$(TORCH)"
	# Keep the torch just installed: a dependency asking for torch must not pull another build.
	$(1)/bin/python -c "import torch; print('torch==' + torch.__version__)" > $(1)/constraints.txt
	$(1)/bin/python -m pip install -c $(1)/constraints.txt -e ".[$(2)]"
	touch $(1)/.installed
endef

$(VENV)/.installed: pyproject.toml
	$(call venv,$(VENV),$(EXTRAS))

$(LATEST)/.installed: pyproject.toml
	$(call venv,$(LATEST),dev)

install: $(VENV)/.installed

demo: install
	$(BIN)/embodied demo

# pytest on both cores, where exit code 5 (no tests collected) is a failure.
pytest = $(1)/bin/python -m pytest -q -n 2 $(2); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# Lint, the whole suite (MuJoCo 3.3 + Meta-World), then the simulator tests on the newest MuJoCo.
test: lint test-suite test-mujoco-latest

# The whole suite, long end-to-end runs included (a plain `pytest` leaves out those marked slow).
test-suite: install
	$(call pytest,$(VENV),-m "")

# The quick suite while developing.
test-fast: install
	$(call pytest,$(VENV),)

test-mujoco-latest: $(LATEST)/.installed
	$(LATEST)/bin/python -c "import mujoco; print('newest-MuJoCo check on mujoco', mujoco.__version__)"
	$(call pytest,$(LATEST),tests/test_tabletop.py tests/test_sims_tasks.py tests/test_cli.py \
		tests/test_trajectory.py tests/test_collect.py tests/test_labels.py)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	LINT_IMPORTS=$(abspath $(BIN))/lint-imports .ci/lint-imports

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install
	$(BIN)/embodied bench sim

clean:
	rm -rf $(VENV) $(LATEST) build *.egg-info
