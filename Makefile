# Front door. `make test` and `make demo` build everything they need from nothing.
SHELL := /bin/bash
PYENV_ROOT ?= $(shell pyenv root 2>/dev/null || echo $$HOME/.pyenv)
PYTHON312 ?= $(PYENV_ROOT)/versions/3.12.1/bin/python3.12
# NeMo Gym >= 0.5 asks for Python >= 3.13.14: a source tree that does gets its environment on this one.
PYTHON313 ?= $(PYENV_ROOT)/versions/3.13.0/bin/python3.13
UV_VERSION := 0.13.8
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
PY := $(VENV)/bin/python
# The dedicated NeMo Gym environment: nemo-gym==0.4.0 pinned by nemo-gym/requirements.txt, plus our
# own packages (no dependencies) for the launcher and the plugins' server subclasses.
GYM_VENV := .gym/venv
export RELAX_GYM_NEMO_GYM_PYTHON ?= $(abspath $(GYM_VENV))/bin/python
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(VENV)
export RELAX_GYM_UV := $(abspath $(UV))
# Bytecode is cached under .tools/pycache, outside the source tree and the environments (`make clean` removes
# it), even where the shell sets PYTHONDONTWRITEBYTECODE: otherwise every process the suite starts (CLI runs,
# NeMo Gym servers, Ray workers) compiles all it imports again, and NeMo Gym's imports alone cost seconds. (The
# few test processes given an environment of their own write gitignored __pycache__ beside the sources.)
export PYTHONPYCACHEPREFIX := $(abspath $(TOOLS))/pycache
unexport PYTHONDONTWRITEBYTECODE

# Plugin distributions (a directory under plugins/ without a pyproject.toml is not one yet).
PLUGINS := $(patsubst %/,%,$(dir $(wildcard plugins/*/pyproject.toml)))
# Extra packages a plugin's NeMo Gym servers need (pip requirement lines), compiled into the one lock.
GYM_EXTRAS := $(sort $(wildcard plugins/*/nemo-gym-requirements.txt))

.PHONY: test test-fast demo lint typecheck bench env gym gym-lock clean claude-code browser

# The Claude Code CLI the reasoning_gym_cc agent runs: pinned, in a project-local npm prefix (never global,
# never fetched at trial time); plugins/reasoning_gym_cc finds it there (or at $$RELAX_GYM_CC_CLAUDE).
CLAUDE_CODE_VERSION := 2.1.237
CLAUDE_CODE := $(TOOLS)/claude-code/.installed-$(CLAUDE_CODE_VERSION)

$(UV):
	@test -x "$(PYTHON312)" || { echo "Python 3.12 not found at $(PYTHON312); set PYTHON312=/path/to/python3.12" >&2; exit 1; }
	"$(PYTHON312)" -m pip install --quiet --disable-pip-version-check --target $(TOOLS) uv==$(UV_VERSION)

$(VENV)/.synced: $(UV) pyproject.toml uv.lock $(wildcard plugins/*/pyproject.toml)
	$(UV) sync --python "$(PYTHON312)" --all-extras --all-packages --locked
	@touch $@

# The NeMo Gym environment is made anew when it is of another Python minor than $(1) (a 3.13 tree's, then the lock's).
minor = "$(1)" -c 'import sys; print("%d.%d" % sys.version_info[:2])'
fresh_venv = if [ -x $(GYM_VENV)/bin/python ] && [ "$$($(call minor,$(GYM_VENV)/bin/python))" != "$$($(call minor,$(1)))" ]; \
	then echo "$(GYM_VENV) is of another Python than $(1): made anew"; rm -rf $(GYM_VENV); fi

# One sync: the lock's pins plus our packages, editable (sync installs exactly these, no dependencies), so
# nothing goes missing meanwhile for a test run using the environment.
$(GYM_VENV)/.synced: $(UV) nemo-gym/requirements.txt pyproject.toml $(wildcard plugins/*/pyproject.toml)
	@$(call fresh_venv,$(PYTHON312))
	test -x $(GYM_VENV)/bin/python || $(UV) venv --quiet --python "$(PYTHON312)" $(GYM_VENV)
	$(UV) pip sync --quiet --python $(GYM_VENV)/bin/python --no-sources nemo-gym/requirements.txt \
		<(printf -- '-e %s\n' $(abspath . $(PLUGINS)))
	@rm -f $(GYM_VENV)/.source
	@touch $@

# NEMO_GYM_SOURCE=DIR make gym: NeMo Gym from a source tree instead (a checkout of NVIDIA-NeMo/Gym, e.g. the
# Relax image's /opt/nemo-gym at the commit Relax pins), installed editable in compat mode so its servers'
# data and configs are read in place (a wheel built without git would lose them). Its own dependencies
# resolve from the index (no lock: the tree says what it needs), beside the plugins' NeMo Gym-side pins.
# Always re-run (a tree changes without make knowing); back to the PyPI lock with plain `make gym`.
NEMO_GYM_SOURCE ?=
ifeq ($(strip $(NEMO_GYM_SOURCE)),)
GYM_STAMP := $(GYM_VENV)/.synced
else
GYM_STAMP := $(GYM_VENV)/.source
.PHONY: $(GYM_STAMP)
endif

# The tree says which Python it needs (requires-python): its floor picks the interpreter (3.12, or PYTHON313 from
# 3.13 on) and is the floor dependencies resolve for, so a 3.13.0 here installs what asks for 3.13.14 (say so: a
# real 3.13.14+ is what NeMo Gym asks for). An environment of another Python is made anew.
GYM_FLOOR = $(shell "$(PYTHON312)" -c 'import re, sys, tomllib; spec = tomllib.load(open(sys.argv[1], "rb"))["project"].get("requires-python", ""); m = re.search(r">=\s*([0-9.]+)", spec); print(m.group(1) if m else "3.12")' "$(NEMO_GYM_SOURCE)/pyproject.toml" 2>/dev/null)
GYM_PYTHON = $(if $(filter 3.12 3.12.%,$(GYM_FLOOR)),$(PYTHON312),$(PYTHON313))

$(GYM_VENV)/.source: $(UV)
	@test -f "$(NEMO_GYM_SOURCE)/pyproject.toml" && test -d "$(NEMO_GYM_SOURCE)/nemo_gym" || \
		{ echo "NEMO_GYM_SOURCE=$(NEMO_GYM_SOURCE) is not a NeMo Gym source tree (no pyproject.toml and nemo_gym/)" >&2; exit 2; }
	@test -x "$(GYM_PYTHON)" || { echo "NeMo Gym at $(NEMO_GYM_SOURCE) needs Python >= $(GYM_FLOOR): none at $(GYM_PYTHON); set PYTHON313=/path/to/python3.13" >&2; exit 1; }
	@$(call fresh_venv,$(GYM_PYTHON))
	test -x $(GYM_VENV)/bin/python || $(UV) venv --quiet --python "$(GYM_PYTHON)" $(GYM_VENV)
	mkdir -p "$(NEMO_GYM_SOURCE)/cache"  # its pyproject writes its egg-info there (egg_base = "cache")
	$(UV) pip install --quiet --python $(GYM_VENV)/bin/python --python-version $(GYM_FLOOR) \
		--config-settings editable_mode=compat \
		-e "$(abspath $(NEMO_GYM_SOURCE))" $(foreach f,$(GYM_EXTRAS),-r $(f))
	$(UV) pip install --quiet --python $(GYM_VENV)/bin/python --no-deps --no-sources \
		$(foreach p,$(abspath . $(PLUGINS)),-e $(p))
	@rm -f $(GYM_VENV)/.synced
	@echo "$(abspath $(NEMO_GYM_SOURCE))" > $@

gym: $(GYM_STAMP) $(CLAUDE_CODE)

$(CLAUDE_CODE):
	@command -v npm >/dev/null || { echo "npm not found: Claude Code $(CLAUDE_CODE_VERSION) is installed with npm (apt-get install nodejs npm)" >&2; exit 1; }
	npm install --prefix $(TOOLS)/claude-code --no-audit --no-fund --loglevel=error @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION)
	@touch $@

claude-code: $(CLAUDE_CODE)

# Headless Chromium for the report's browser tests (tests/rollout/test_report_browser.py): Debian's package,
# installed when missing where we are root (CI is); elsewhere it says so and those tests skip (in CI they fail).
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null; \
	else echo "chromium not found (apt-get install chromium): the report's browser tests will skip" >&2; fi

# Re-pin nemo-gym/requirements.txt after editing requirements.in or a plugin's nemo-gym-requirements.txt
# (tests/packaging/test_gym_lock.py fails until the lock covers every plugin's requirement).
gym-lock: | $(UV)
	$(UV) pip compile --quiet nemo-gym/requirements.in $(GYM_EXTRAS) --universal --python-version 3.12 \
		-o nemo-gym/requirements.txt

uv.lock: pyproject.toml $(wildcard plugins/*/pyproject.toml) | $(UV)
	$(UV) lock --python "$(PYTHON312)"

env: $(VENV)/.synced

# pytest-xdist workers (one per core by default; `PYTEST_WORKERS=0` runs in one process). --dist loadgroup
# keeps the tests of each shared NeMo Gym server set on one worker, so each set starts once.
# One worker more than cores: a worker waiting on servers it starts (or on Ray) leaves its core to another
# (on 2 cores, 3 workers: 350 s against 391 s for the fresh clone's `make test`, bench/README.md).
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
XDIST := -n $(PYTEST_WORKERS) --dist loadgroup

# Everything: lint and types first (seconds; they run here so they cannot rot), then every test. The set-up
# steps run side by side (NeMo Gym's environment downloads while the types are checked, Chromium installs for the
# browser tests); make keeps their order where one needs another.
test:
	@$(MAKE) --no-print-directory -j4 env gym lint typecheck browser
	$(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

# For development: no NeMo Gym servers, no real CLI end to end, nothing slow (markers e2e and slow).
test-fast: env gym
	$(PY) -m pytest -q $(XDIST) -m "not e2e and not slow" $(PYTEST_ARGS)

demo: env gym
	$(PY) -m relax_gym_core.commands.demo

lint: env
	$(VENV)/bin/ruff check src tests bench plugins
	$(VENV)/bin/ruff format --check src tests bench plugins

typecheck: env
	$(VENV)/bin/mypy

bench: env gym
	$(PY) bench/lifecycle.py
	$(PY) bench/bridge.py
	$(PY) bench/bridge_python.py
	$(PY) bench/rollout.py
	$(PY) bench/server_start.py
	$(PY) bench/replicas.py

clean:
	rm -rf $(VENV) $(TOOLS) .gym
