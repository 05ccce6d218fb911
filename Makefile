PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# Bytecode is cached (some hosts set PYTHONDONTWRITEBYTECODE for every process): without it
# each process the tests start (a server, a CLI command, a job's controller, each pytest
# worker with its rewritten test modules) compiles its sources again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test lint typecheck docs bench chaos chaos-replicas chaos-db fleet clean sandbox-tools gpu-kit

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet 'torch==2.13.0'
	$(BIN)/pip install --quiet -e '.[examples,dev,ray,postgres,sim,docs]'
	touch $(STAMP)

# Learners run under bubblewrap; root installs it (and iproute2 for distributed jobs).
sandbox-tools:
	@if ! command -v bwrap >/dev/null || ! command -v ip >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq bubblewrap iproute2 util-linux >/dev/null; \
	  else \
	    echo "bubblewrap is missing: ask an administrator to 'apt-get install bubblewrap'"; \
	  fi; \
	fi

demo: $(STAMP) sandbox-tools
	$(BIN)/ffdl demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples data tools
	$(BIN)/ruff format --check src tests benchmarks examples data tools

typecheck: $(STAMP)
	$(BIN)/mypy

# Two workers by default (CI has two cores); each takes whole test files, so a module's
# shared fixtures (its Ray cluster, its PostgreSQL server) are made once. The tests marked
# `serial` (live timings against a model, one process's pace) run afterwards, with the
# machine to themselves. Files go out in collection order, which tests/conftest.py starts
# with the longest. PYTEST_WORKERS=0 runs the first part in one process too.
PYTEST_WORKERS ?= 2

test: lint typecheck docs
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not serial"
	$(BIN)/pytest -q -m serial

# The documentation site, from docs/ and the pages generated from the code
# (tools/docs_hooks.py), into site/; any broken link or anchor fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

# The long chaos run (300 jobs, 6 clients, servers killed for up to 60 s); a short
# version runs in `make test` (tests/integration/test_chaos.py).
chaos: $(STAMP) sandbox-tools
	$(BIN)/python benchmarks/chaos.py $(CHAOS_ARGS)

# Replicas on PostgreSQL: 200 jobs from 6 clients while loop leaders are SIGKILLed; a short
# version runs in `make test` (tests/replicas/test_replicas_live.py).
chaos-replicas: $(STAMP) sandbox-tools
	$(BIN)/python benchmarks/chaos_replicas.py $(CHAOS_ARGS)

# The database as the fault: PostgreSQL killed for 5 s, 30 s and 2 minutes, then failed over
# to its standby, while jobs run, submits arrive and follow streams are open; a short
# version runs in `make test` (tests/replicas/test_database_faults.py).
chaos-db: $(STAMP) sandbox-tools
	$(BIN)/python benchmarks/chaos_db.py $(CHAOS_ARGS)

# The control plane at fleet scale with simulated learners (docs/scale.md); a short version
# runs in `make test` (tests/integration/test_fleet_simulated.py).
fleet: $(STAMP)
	$(BIN)/python benchmarks/fleet.py $(FLEET_ARGS)

# Wheels, bwrap and a runner for a GPU host without a package index (tools/gpu-kit): then,
# there, from the project's root, `bash .gpu-kit/run.sh` runs the GPU tests and benchmarks.
gpu-kit: $(STAMP)
	$(BIN)/python tools/gpu-kit/prepare.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
