# tally: two commands matter on a fresh machine: `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
UV_VERSION := 0.13.8
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
BIN := $(VENV)/bin
DATA := data
PORT ?= 8000

export UV_PROJECT_ENVIRONMENT := $(VENV)

.PHONY: setup run test lint typecheck pytest bench browser-deps postgres-deps bench-deps clean

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

$(VENV)/.synced: $(UV) pyproject.toml sdk/pyproject.toml uv.lock
	$(UV) sync --frozen --quiet
	touch $@

setup: $(VENV)/.synced

# Debian's headless Chromium for the browser tests (skipped when already installed).
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# Debian's PostgreSQL server binaries (initdb, pg_ctl) for the tests on the PostgreSQL backend: the
# tests start clusters of their own in temporary directories (tests/pg.py), so no system service
# needs to be up (skipped when already installed).
postgres-deps:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; }

bench-deps:
	@command -v wrk >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }

run: setup
	@mkdir -p $(DATA)
	@test -s $(DATA)/operator-token || { umask 077; $(BIN)/python -c "import secrets; print(secrets.token_urlsafe(32))" > $(DATA)/operator-token; }
	@echo "tally: operator token is in $(DATA)/operator-token (send it as 'Authorization: Bearer <token>')"
	@export TALLY_DATABASE=$(DATA)/tally.duckdb \
	  TALLY_OPERATOR_TOKEN="$$(cat $(DATA)/operator-token)" \
	  TALLY_BASE_URL=$${TALLY_BASE_URL:-http://127.0.0.1:$(PORT)} \
	  TALLY_STRIPE_WEBHOOK_SECRETS=$${TALLY_STRIPE_WEBHOOK_SECRETS:-whsec_local_demo_secret}; \
	$(BIN)/tally serve --host 127.0.0.1 --port $(PORT) & pid=$$!; \
	trap 'kill $$pid 2>/dev/null; wait $$pid' INT TERM; \
	$(BIN)/tally demo --url http://127.0.0.1:$(PORT) --state $(DATA)/demo.json \
	  || echo "tally: the demo traffic did not complete; the server keeps running"; \
	wait $$pid

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy

# Two workers on the two-core machine (pytest-xdist); work stealing evens out the long property tests.
PYTEST_WORKERS ?= 2

pytest: setup browser-deps postgres-deps
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist worksteal

test: lint typecheck pytest

bench: setup bench-deps postgres-deps
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) $(TOOLS) .mypy_cache .ruff_cache .pytest_cache
