# One command each: `make test` (set up + full test suite) and `make demo` (set up + a batch run on the
# embedded default model). Both create .venv/ and install what they need on a fresh machine: the demo
# only torch, the `serve` extra and bubblewrap; the tests every extra, the trainers' converters and
# chromium.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.trajforge-installed
DEMO_STAMP := $(VENV)/.trajforge-demo-installed
# torch is installed first and pinned here (the package itself accepts a range), so machines with a
# local CPU wheel don't pull a multi-GB CUDA build. Override: make test TORCH_SPEC='torch==X'.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup demo-setup system-deps demo-system-deps test test-fast demo rl-demo lint bench clean docker-engine docker-engine-stop bench-venv llamacpp

$(PY):
	python3 -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[ml,dev,tools,atropos,verifiers,ray,rl,swe]'
	# trainer data converters tested by tests/test_trainer_formats.py: their pins clash with TRL/datasets, so no deps
	$(PY) -m pip install -q --no-deps llamafactory==0.9.5 axolotl==0.19.0
	touch $(STAMP) $(DEMO_STAMP)

# What the demo runs: the package, torch and the serve extra (the embedded model behind `trajforge
# serve`). Nothing of Atropos, verifiers, Ray, TRL, the trainers' converters or chromium.
# --no-compile: no .pyc for every module of every package now (torch alone has thousands); Python
# writes them for what it imports, on first use.
$(DEMO_STAMP): pyproject.toml | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q --no-compile "$(TORCH_SPEC)"
	$(PY) -m pip install -q --no-compile -e '.[serve]'
	touch $(DEMO_STAMP)

demo-system-deps:
	@command -v bwrap >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq bubblewrap; }
	@# a C compiler and libc's headers (and static archive, for docker) build the sandboxes' exec agent,
	@# exec_agent.c, at a factory's first sandbox: without them no sandbox starts (README, Concepts)
	@command -v cc >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq gcc libc6-dev; }

system-deps: demo-system-deps
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq chromium; }
	@# the docker backend's tests: Debian's engine and debootstrap for the locally built base image
	@{ command -v dockerd && command -v debootstrap; } >/dev/null || { $(SUDO) apt-get update -qq && \
		$(SUDO) apt-get install -y -qq --no-install-recommends docker.io debootstrap; }
	@# llama.cpp's servers, built from source for tests/test_llamacpp_servers.py (make llamacpp)
	@{ command -v cmake && command -v c++; } >/dev/null || { $(SUDO) apt-get update -qq && \
		$(SUDO) apt-get install -y -qq --no-install-recommends cmake g++ ninja-build; }
	@# the fidelity suite's workloads (tests/fidelity.py), the same tools as the docker base image's
	@( for c in tmux sqlite3 curl git make ps top script flock ipcmk; do command -v $$c || exit 1; done; \
		/usr/bin/python3 -c 'import venv, ensurepip, pip, pytest, xdist' ) >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
		$(SUDO) apt-get install -y -qq --no-install-recommends tmux sqlite3 curl git make procps bsdutils util-linux \
		python3-venv python3-pip python3-pytest python3-pytest-xdist; }

setup: system-deps $(STAMP)

# llama.cpp's two servers for tests/test_llamacpp_servers.py (issue 37): llama-cpp-python's server
# and llama-server, both built from PyPI's llama-cpp-python sdist (CPU, GGML_NATIVE=OFF), and the
# embedded tiny policy converted to GGUF. Outputs and stamps live in ~/.cache/trajforge/llamacpp/
# (or $$TRAJFORGE_LLAMACPP_HOME): only the first build on a machine pays (~40 min on two shared
# cores; pip also keeps the wheel it built); later runs check the stamps and return. Where no
# compiler or CMake exists, it records why and the tests skip saying so.
llamacpp: setup
	nice -n 10 $(PY) tests/llamacpp.py prepare

# The published benchmark packages need Python >= 3.12 and trajforge runs on 3.11: they get a
# virtualenv of their own, run as programs (never imported), seen read-only by the sandboxes
# (src/trajforge/benchpython.py, docs/envs.md "yc_bench"). The interpreter: PY312=/path/to/python,
# else the first that runs of python3.12, python3.13 on PATH, pyenv's 3.12.x, then 3.13.x (newest first).
BENCH_VENV ?= .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.trajforge-bench-installed
BENCH_PACKAGES := yc-bench==0.1.0 harbor==0.26.0
PYENV_ROOT ?= $(HOME)/.pyenv

$(BENCH_STAMP): Makefile
	@if [ -n "$(PY312)" ]; then tries="$(PY312)"; else \
		tries="python3.12 python3.13 $$(for v in 3.12 3.13; do ls -d $(PYENV_ROOT)/versions/$$v*/bin/python 2>/dev/null | sort -V -r; done)"; fi; \
	py=""; for t in $$tries; do \
		c=$$(command -v "$$t") && "$$c" -c 'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 12))' 2>/dev/null \
			&& py=$$("$$c" -c 'import sys; print(sys.executable)') && break; \
	done; \
	if [ -z "$$py" ]; then \
		echo "error: the benchmark virtualenv (yc-bench, harbor) needs a Python >= 3.12 with venv; tried: $$tries." \
			"Install one (Debian/Ubuntu: apt-get install python3.12 python3.12-venv; or pyenv install 3.12)" \
			"or name it: make bench-venv PY312=/path/to/python3.12" >&2; \
		exit 1; \
	fi; \
	echo "benchmark virtualenv $(BENCH_VENV) from $$py"; \
	[ -x $(BENCH_VENV)/bin/python ] || "$$py" -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install -q $(BENCH_PACKAGES)
	touch $(BENCH_STAMP)

bench-venv: $(BENCH_STAMP)

# The reference runner of issue 29 (Hermes Agent's batch_runner.py), for
# benchmarks/reference_runner.py: it pins dozens of packages, so it gets a virtualenv of its own from
# the system python3 (3.11), run as a program, never imported by trajforge. Nothing is installed
# when the pinned version is already there.
REF_VENV ?= .venv-ref
REF_STAMP := $(REF_VENV)/.trajforge-ref-installed
REF_PACKAGE := hermes-agent
REF_VERSION := 0.19.0

$(REF_STAMP): Makefile
	@echo "reference-runner virtualenv $(REF_VENV) from $$(python3 -c 'import sys; print(sys.executable)')"
	[ -x $(REF_VENV)/bin/python ] || python3 -m venv $(REF_VENV)
	$(REF_VENV)/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('$(REF_PACKAGE)') != '$(REF_VERSION)')" 2>/dev/null \
		|| { $(REF_VENV)/bin/python -m pip install -q --upgrade pip && \
			$(REF_VENV)/bin/python -m pip install -q $(REF_PACKAGE)==$(REF_VERSION); }
	touch $(REF_STAMP)

.PHONY: bench-ref
bench-ref: $(REF_STAMP)

demo-setup: demo-system-deps $(DEMO_STAMP)

# The docker tests' base image is built here, outside any test's timeout (the first time on a
# machine: debootstrap, about a minute); their private dockerd is started and stopped by the tests.
# Three workers on two cores: much of the suite waits on sandboxes, containers, servers and
# Chromium (measured 2026-12-04: 592 s with three, 719 s with two); each worker's torch runs one
# thread (tests/conftest.py), or the workers' thread pools spin against each other.
PYTEST_WORKERS ?= 3

test: setup bench-venv llamacpp
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy
	$(PY) tests/docker_engine.py prepare
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadfile -q $(PYTEST_ARGS)

test-fast: setup bench-venv
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadfile -q -m "not slow" $(PYTEST_ARGS)

# The main job on the embedded default: the tiny policy is served on loopback by `trajforge serve`
# (no --model/--base-url), every task runs in its own bubblewrap sandbox. Each demo is a new run
# directory (data/demo-YYYYmmdd-HHMMSS): nothing of an earlier one, exports included, is deleted.
# --env tiny_tasks grades each line in its sandbox: the summary says how many tasks were solved.
demo: demo-setup
	$(VENV)/bin/trajforge batch examples/tasks.jsonl --run-name demo-$$(date +%Y%m%d-%H%M%S) --output-dir data \
		--toolsets terminal,file --env tiny_tasks --progress plain

# The closed loop (issues 12, 25): the recipe's tiny policy measured held-out (greedy and sampled at
# the training temperature, paired), a short supervised warm start on the env's oracle trajectories,
# GRPO, and an equal-compute supervised control, each measured alike (20 minutes on CPU); report.json,
# the figure and the table (printed last) in the run directory.
rl-demo: setup
	$(VENV)/bin/trajforge rl demo --output-dir data --run-name rl-demo-$$(date +%Y%m%d-%H%M%S)

# A private Docker engine for `--sandbox docker` by hand (tests/docker_engine.py): its own state in
# /var/lib/trajforge-docker, no bridge, no iptables rules; prints the DOCKER_HOST to use and the
# locally built Debian base image. Stopped by `make docker-engine-stop`.
docker-engine: system-deps
	@python3 tests/docker_engine.py start
	@python3 tests/docker_engine.py base-image

docker-engine-stop:
	@python3 tests/docker_engine.py stop

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) $(BENCH_VENV) build dist src/*.egg-info .pytest_cache .ruff_cache .mypy_cache
