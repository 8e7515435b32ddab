# The two commands of the README. Both create .venv and install what they need on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test install install-all

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Core install only: the gatekeeper never needs torch or vllm.
install: $(BIN)/python
	$(BIN)/pip install -q -e .

# Everything the tests exercise: core + dev + the kernels and vllm extras.
install-all: $(BIN)/python
	$(BIN)/pip install -q -e '.[dev,kernels,vllm]'

# The example PR with the evidence `gatekeeper collect` recorded for it (examples/README.md says how): every rule decided.
demo: install
	$(BIN)/gatekeeper check --policy policies/kimi-k3-latency-specialized.yaml --pr-files examples/pr-confined/pr-files.json --pr examples/pr-confined/pull.json --commits examples/pr-confined/commits.json --evidence examples/pr-confined/evidence.json

test: install-all
	$(BIN)/python -m pytest; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc
