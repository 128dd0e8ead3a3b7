# Signalbox — every target says what it does: `make help`.
.DEFAULT_GOAL := help
SHELL := /bin/bash
PYTHON ?= python3
UV := $(shell command -v uv 2>/dev/null || echo "$(PYTHON) -m uv")
PYTEST_ARGS ?=
# `make test` runs on this many pytest-xdist workers, each with its own
# PostgreSQL, Redis, stacks and ports (0: in this process, no workers). On the
# machine's servers (SIGNALBOX_TEST_REDIS_URL, SIGNALBOX_TEST_DATABASE_URL)
# the workers would flush each other's Redis databases and share one
# PostgreSQL's connection slots: one process then.
TEST_WORKERS ?= $(if $(SIGNALBOX_TEST_REDIS_URL)$(SIGNALBOX_TEST_DATABASE_URL),0,2)
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist worksteal)

.PHONY: help install test-deps run test test-fast test-unit test-ts test-deploy lint typecheck bench soak soak-bloat clean

help: ## Show the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-12s %s\n", $$1, $$2}'

install: ## Install uv (if missing) and the locked Python dependencies into .venv
	@command -v uv >/dev/null 2>&1 || $(PYTHON) -m uv --version >/dev/null 2>&1 || $(PYTHON) -m pip install --quiet uv
	$(UV) sync --frozen

test-deps: ## Install the real mail servers the provider tests use (Dovecot, MailDev)
	bash scripts/install-test-deps.sh

run: install ## Start the whole stack (API, SMTP sink, worker, beat, Flower) on embedded PostgreSQL and Redis
	$(UV) run signalbox-server up

test: install test-deps ## Run the whole test suite on real PostgreSQL, Redis, workers and mail servers (TEST_WORKERS=2 in parallel)
	$(UV) run pytest $(XDIST) $(PYTEST_ARGS)

test-fast: install ## The inner loop: unit and architecture tests, and the integration tests needing no server beyond PostgreSQL and Redis
	$(UV) run pytest $(XDIST) tests/unit tests/integration tests/security clients/python/tests -m "not servers and not providers" $(PYTEST_ARGS)

test-unit: install ## Run the unit tests only (no I/O)
	$(UV) run pytest tests/unit clients/python/tests -m "not integration and not acceptance" $(PYTEST_ARGS)

test-ts: install test-deps ## The TypeScript client's Node tests and the Playwright example (Chromium), on a fresh stack
	$(UV) run pytest tests/clients $(PYTEST_ARGS)

test-deploy: install ## Render and validate deploy/kubernetes and docker-compose.yml (kubectl needed)
	$(UV) run pytest tests/deploy/test_kubernetes.py tests/deploy/test_compose.py $(PYTEST_ARGS)

LINT_PATHS := app workers tests clients/python bench

lint: install ## ruff (rules and a complexity limit), ruff format --check, mypy (app/, workers/); CI runs it first
	$(UV) run ruff check $(LINT_PATHS)
	$(UV) run ruff format --check $(LINT_PATHS)
	$(UV) run mypy

bench: install ## Benchmarks (each prints its machine and figures): lifecycles, ingest, idle, CPU per request, time to found, coalescing, matching cost, disk per message, the machine's floor, a unit of work, the API without its server, where delivery-to-found goes, the inbox at 100,000 messages
	$(UV) run python bench/lifecycle.py
	$(UV) run python bench/floor.py
	$(UV) run python bench/ingest.py
	$(UV) run python bench/idle.py
	$(UV) run python bench/requests.py
	$(UV) run python bench/time_to_found.py
	$(UV) run python bench/coalesced_checks.py
	$(UV) run python bench/match_cost.py
	$(UV) run python bench/storage.py
	$(UV) run python bench/units_of_work.py
	$(UV) run python bench/api_inprocess.py
	$(UV) run python bench/found_path.py
	$(UV) run python bench/inbox.py

soak: install test-deps ## The full soak and chaos run (thousands of signals, every fault once, partitions and overload included; root) and its invariant table
	$(UV) run python bench/soak.py --signals 2000 --duration 420 --partition --overload 60 \
		--fault-count 12 --provider-outage 30 --exhaust-for 30 --partition-for 20 --idle-for 60

soak-bloat: install test-deps ## The soak with a transaction left idle for five minutes (the xmin horizon pinned), dead rows reported
	$(UV) run python bench/soak.py --signals 2000 --duration 420 --faults idle_in_transaction \
		--fault-count 1 --idle-for 300 --idle-after 30

clean: ## Remove the embedded services' data (.signalbox/) and caches
	rm -rf .signalbox .pytest_cache .mypy_cache .ruff_cache
