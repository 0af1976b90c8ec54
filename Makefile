# Two commands do everything on a fresh machine: `make run` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
export VENV

.PHONY: install run test test-quick bench profile profile-api capacity chaos chaos-net load cluster cluster-down lint format typecheck clean

install:
	@scripts/bootstrap.sh

# In a terminal, the script runs as a job of its own (set -m), with the terminal's Ctrl-C
# to itself: it stops the stack and exits 0, and make, which never sees the Ctrl-C, exits
# 0 too (make itself dies of a Ctrl-C it receives, whatever the script does).
run: install  ## start PostgreSQL, Redis, web, worker, webhooks, beat and Flower
	@if [ -t 0 ]; then set -m; fi; scripts/run.sh; exit $$?

# The browser tests need Debian's chromium: `install` adds it for `make test` only.
test: export WITH_BROWSER := 1
test: install  ## throwaway PostgreSQL and Redis, then ruff, mypy and pytest
	@scripts/test.sh $(PYTEST_ARGS)

# A few tests while working on them: the same throwaway servers, pytest alone (no ruff,
# mypy or import contracts, which make test runs first).
test-quick: export WITH_BROWSER := 1
test-quick: install  ## throwaway PostgreSQL and Redis, then pytest alone (PYTEST_ARGS="tests/x.py -x")
	@PYTEST_ONLY=1 scripts/test.sh $(PYTEST_ARGS)

bench: install  ## engine vs raw Celery on throwaway servers (BENCH_JSON=path for JSON)
	@scripts/bench.sh

profile: install  ## one step's cost in the engine, in process, under cProfile (PROFILE_ARGS="--steps 500")
	@scripts/bench.sh profile $(PROFILE_ARGS)

profile-api: install  ## an API request's cost by layer, in process, on throwaway servers (PROFILE_API_ARGS="--requests 100 --route create")
	@scripts/bench.sh profile-api $(PROFILE_API_ARGS)

capacity: install  ## PostgreSQL's cost of a step and a small run: statements, rows, WAL, CPU (CAPACITY_ARGS="--json path")
	@scripts/bench.sh capacity $(CAPACITY_ARGS)

chaos: install  ## faults injected under a mixed workload; exit 1 if anything is lost (CHAOS_JSON=path)
	@scripts/chaos.sh $(CHAOS_ARGS)

load: install  ## locust against gunicorn, then every run checked; exit 1 on a 5xx or inconsistency (LOAD_JSON=path)
	@scripts/load.sh $(LOAD_ARGS)

chaos-net: install  ## root only: make chaos's workload on make cluster's hosts while hosts are partitioned, lost and failed over (CHAOS_NET_JSON=path)
	@scripts/chaos_net.sh $(CHAOS_NET_ARGS)

cluster: install  ## root only: the stack as 14 hosts in network namespaces, proved by runs through each web host (CLUSTER_ARGS=--check: then removed)
	@$(VENV)/bin/python scripts/cluster.py up $(CLUSTER_ARGS)

cluster-down:  ## stop every process of make cluster, remove its namespaces, bridge and data
	@$(VENV)/bin/python scripts/cluster.py down

lint: install
	@$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: install
	@$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

typecheck: install
	@$(VENV)/bin/mypy .

# scripts/local_servers.py (stdlib only) stops make run's servers and finds PostgreSQL's
# data where it lives, in .data/ or the folder under /var/tmp a checkout under a 0700
# parent uses.
clean:  ## stop make run's servers, remove their data (the make-run database) and caches
	@[ ! -d .data ] || python3 scripts/local_servers.py remove --dir .data
	rm -rf .pytest_cache .mypy_cache .ruff_cache
