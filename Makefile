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

# LeRobot interop (`make test-lerobot`): LeRobot needs Python 3.12 and its own torch, so it gets an
# environment of its own. The pinned LeRobot (with the extras its diffusion policy and SmolVLA need)
# and this toolkit's dependencies are installed once into a cache shared by every checkout (keyed by
# the LeRobot version and extras); each checkout then makes a small venv that sees the cache's
# packages (a .pth file) and installs itself editable on top.
LEROBOT_VERSION ?= 0.6.1
LEROBOT_EXTRAS ?= dataset,training,diffusion,smolvla
comma := ,
LEROBOT_CACHE ?= $(HOME)/.cache/embodied-toolkit/lerobot-$(LEROBOT_VERSION)-py312-$(subst $(comma),-,$(LEROBOT_EXTRAS))
LEROBOT_VENV := .venv-lerobot
# The first Python 3.12 that runs: python3.12 on PATH (a pyenv shim may not), then pyenv's.
LEROBOT_PYTHON ?= $(firstword $(foreach p,python3.12 $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12),$(if $(shell $(p) -c 'import sys; print(sys.version_info[:2] == (3, 12))' 2>/dev/null | grep True),$(p))))
SITE312 := lib/python3.12/site-packages

.PHONY: install demo test test-suite test-fast test-mujoco-latest test-lerobot lint format bench clean

# $(call venv,DIR,EXTRAS): create DIR with torch first, pinned by a constraints file, then the package.
# A current pip resolves and unpacks the ~80 packages faster than the one a venv starts with. pip
# compiles bytecode on one core; compileall does it on every core, this checkout's packages too
# (an editable install copies nothing to compile), so no process compiles them again at import,
# which matters where PYTHONDONTWRITEBYTECODE is set. A few files are not valid for this Python
# (torch's Python 3.12 test helpers): pip skips those as well, hence the `|| true`.
define venv
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q --no-compile --upgrade pip
	$(1)/bin/python -c "import torch" 2>/dev/null || $(1)/bin/python -m pip install --no-compile "$(TORCH)"
	# Keep the torch just installed: a dependency asking for torch must not pull another build.
	$(1)/bin/python -c "import torch; print('torch==' + torch.__version__)" > $(1)/constraints.txt
	$(1)/bin/python -m pip install --no-compile -c $(1)/constraints.txt -e ".[$(2)]"
	$(1)/bin/python -m compileall -qq -j 0 embodied sims policies rewards datasets \
		$$($(1)/bin/python -c "import sysconfig; print(sysconfig.get_path('purelib'))") || true
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
	$(call pytest,$(LATEST),tests/test_tabletop.py tests/test_tabletop_experts.py \
		tests/test_tabletop_errors.py tests/test_sims_tasks.py tests/test_cli.py \
		tests/test_trajectory.py tests/test_collect.py tests/test_labels.py)

# The interop tests (tests/lerobot) in the LeRobot environment; loudly skipped without Python 3.12.
test-lerobot:
ifeq ($(LEROBOT_PYTHON),)
	@echo "################################################################################"
	@echo "## SKIPPED: make test-lerobot needs Python 3.12 (LeRobot $(LEROBOT_VERSION) requires it);"
	@echo "## none found on PATH or under ~/.pyenv/versions. The LeRobot interop tests did NOT run."
	@echo "################################################################################"
else
	@if [ ! -f "$(LEROBOT_CACHE)/.installed" ]; then \
		echo "Building the LeRobot $(LEROBOT_VERSION) environment in $(LEROBOT_CACHE) (once)"; \
		tmp="$(LEROBOT_CACHE).tmp-$$$$"; rm -rf "$$tmp"; set -e; \
		$(LEROBOT_PYTHON) -m venv "$$tmp"; \
		"$$tmp/bin/python" -m pip install -q "lerobot[$(LEROBOT_EXTRAS)]==$(LEROBOT_VERSION)"; \
		"$$tmp/bin/python" -c "import torch; print('torch==' + torch.__version__.split('+')[0])" \
			> "$$tmp/constraints.txt"; \
		"$$tmp/bin/python" -m pip install -q -c "$$tmp/constraints.txt" ".[dev]"; \
		"$$tmp/bin/python" -m pip uninstall -q -y embodied-toolkit; \
		touch "$$tmp/.installed"; \
		mv -T "$$tmp" "$(LEROBOT_CACHE)" 2>/dev/null || rm -rf "$$tmp"; \
	fi
	test -x $(LEROBOT_VENV)/bin/python || $(LEROBOT_PYTHON) -m venv $(LEROBOT_VENV)
	echo "$(LEROBOT_CACHE)/$(SITE312)" > $(LEROBOT_VENV)/$(SITE312)/zz_lerobot_cache.pth
	$(LEROBOT_VENV)/bin/python -m pip install -q --no-build-isolation \
		-c $(LEROBOT_CACHE)/constraints.txt -e ".[dev]"
	# -P: the checkout's own datasets/ folder must not shadow Hugging Face's `datasets`.
	HF_HUB_OFFLINE=1 $(LEROBOT_VENV)/bin/python -P -m pytest -q -p no:cacheprovider tests/lerobot; \
		rc=$$?; if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests" >&2; fi; \
		exit $$(( rc == 5 ? 1 : rc ))
endif

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
	rm -rf $(VENV) $(LATEST) $(LEROBOT_VENV) build *.egg-info
