# The two commands of the README. Both create .venv and install what they need on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test install install-all browser

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Core install only: the gatekeeper never needs torch or vllm.
install: $(BIN)/python
	$(BIN)/pip install -q -e .

# Everything the tests exercise: core + dev + the kernels and vllm extras.
install-all: $(BIN)/python
	$(BIN)/pip install -q -e '.[dev,kernels,vllm]'

# Debian's Chromium for the browser tests (tools/install-browser.sh: nothing to do when present).
browser:
	tools/install-browser.sh

# The example PR with the evidence `gatekeeper collect` recorded for it (examples/README.md says how): every rule decided.
demo: install
	$(BIN)/gatekeeper check --policy policies/kimi-k3-latency-specialized.yaml --pr-files examples/pr-confined/pr-files.json --pr examples/pr-confined/pull.json --commits examples/pr-confined/commits.json --evidence examples/pr-confined/evidence.json

# The App's PostgreSQL tests need a server: tools/postgres-test-server.sh starts a private one (installing
# Debian's package when run as root) unless GATEKEEPER_TEST_POSTGRES_URL names one. Where none can be started
# they are skipped with that reason; CI (.ci/run) starts the server first and fails if it cannot.
test: install-all browser
	@if [ -z "$$GATEKEEPER_TEST_POSTGRES_URL" ]; then \
	    GATEKEEPER_TEST_POSTGRES_URL=$$(tools/postgres-test-server.sh) \
	    || echo "WARNING: no PostgreSQL server could be started: the PostgreSQL tests will be skipped" >&2; \
	fi; \
	export GATEKEEPER_TEST_POSTGRES_URL; \
	$(BIN)/python -m pytest; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc
