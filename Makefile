# Front door. `make test` and `make demo` build everything they need from nothing.
SHELL := /bin/bash
PYENV_ROOT ?= $(shell pyenv root 2>/dev/null || echo $$HOME/.pyenv)
PYTHON312 ?= $(PYENV_ROOT)/versions/3.12.1/bin/python3.12
UV_VERSION := 0.13.8
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
PY := $(VENV)/bin/python
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(VENV)

.PHONY: test demo lint typecheck bench env clean

$(UV):
	@test -x "$(PYTHON312)" || { echo "Python 3.12 not found at $(PYTHON312); set PYTHON312=/path/to/python3.12" >&2; exit 1; }
	"$(PYTHON312)" -m pip install --quiet --disable-pip-version-check --target $(TOOLS) uv==$(UV_VERSION)

$(VENV)/.synced: $(UV) pyproject.toml uv.lock $(wildcard plugins/*/pyproject.toml)
	$(UV) sync --python "$(PYTHON312)" --all-extras --all-packages --locked
	@touch $@

uv.lock: pyproject.toml $(wildcard plugins/*/pyproject.toml) | $(UV)
	$(UV) lock --python "$(PYTHON312)"

env: $(VENV)/.synced

test: env
	$(PY) -m pytest -q $(PYTEST_ARGS)

demo: env
	$(PY) -m relax_gym_core.demo

lint: env
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

typecheck: env
	$(VENV)/bin/mypy

bench: env
	$(PY) bench/lifecycle.py

clean:
	rm -rf $(VENV) $(TOOLS)
