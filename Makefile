# Front door. `make test` and `make demo` build everything they need from nothing.
SHELL := /bin/bash
PYENV_ROOT ?= $(shell pyenv root 2>/dev/null || echo $$HOME/.pyenv)
PYTHON312 ?= $(PYENV_ROOT)/versions/3.12.1/bin/python3.12
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

.PHONY: test demo lint typecheck bench env gym clean

$(UV):
	@test -x "$(PYTHON312)" || { echo "Python 3.12 not found at $(PYTHON312); set PYTHON312=/path/to/python3.12" >&2; exit 1; }
	"$(PYTHON312)" -m pip install --quiet --disable-pip-version-check --target $(TOOLS) uv==$(UV_VERSION)

$(VENV)/.synced: $(UV) pyproject.toml uv.lock $(wildcard plugins/*/pyproject.toml)
	$(UV) sync --python "$(PYTHON312)" --all-extras --all-packages --locked
	@touch $@

$(GYM_VENV)/.synced: $(UV) nemo-gym/requirements.txt pyproject.toml $(wildcard plugins/*/pyproject.toml)
	test -x $(GYM_VENV)/bin/python || $(UV) venv --quiet --python "$(PYTHON312)" $(GYM_VENV)
	$(UV) pip sync --quiet --python $(GYM_VENV)/bin/python nemo-gym/requirements.txt
	$(UV) pip install --quiet --python $(GYM_VENV)/bin/python --no-deps -e . $(addprefix -e ,$(wildcard plugins/*))
	@touch $@

gym: $(GYM_VENV)/.synced

uv.lock: pyproject.toml $(wildcard plugins/*/pyproject.toml) | $(UV)
	$(UV) lock --python "$(PYTHON312)"

env: $(VENV)/.synced

test: env gym
	$(PY) -m pytest -q $(PYTEST_ARGS)

demo: env gym
	$(PY) -m relax_gym_core.demo

lint: env
	$(VENV)/bin/ruff check src tests bench plugins
	$(VENV)/bin/ruff format --check src tests bench plugins

typecheck: env
	$(VENV)/bin/mypy

bench: env gym
	$(PY) bench/lifecycle.py
	$(PY) bench/bridge.py

clean:
	rm -rf $(VENV) $(TOOLS) .gym
