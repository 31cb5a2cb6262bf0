# The README's two commands: `make demo` and `make test`. Each creates .venv and installs what
# it needs when missing, so both work on a fresh clone with only Python 3.11+ and Java 17+.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
# The exact versions the suite passes with, for every extra (`make lock` refreshes it).
LOCK   := requirements.lock.txt
EXTRAS := test,docs,paimon,delta,iceberg,kafka,prometheus,sketches
# `make test-latest`: the newest versions pyproject.toml's ranges allow, in a venv of its own.
LATEST := .venv-latest

comma := ,

.PHONY: demo test test-latest lock docs lint bench clean-venv check-java

$(STAMP): pyproject.toml $(LOCK)
	@scripts/require-python "$(PYTHON)"
	@test -x $(BIN)/python || "$(PYTHON)" -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --upgrade pip
	@$(BIN)/python -m pip install --quiet -c $(LOCK) -e '.[$(EXTRAS)]'
	@touch $(STAMP)

$(BENCH_STAMP): $(STAMP)
	@$(BIN)/python -m pip install --quiet -c $(LOCK) -e '.[test,bench]'
	@touch $(BENCH_STAMP)

check-java:
	@scripts/require-java

demo: $(STAMP) check-java
	@$(BIN)/python examples/quickstart.py

test: $(STAMP) check-java
	@scripts/require-chromium
	@$(BIN)/ruff check --quiet .
	@$(BIN)/mypy
	@$(BIN)/python -m pytest -q

# The same checks against the newest release of every dependency the ranges allow (no lock), so a
# new release that breaks us is caught by this command, not by a user. Prints what moved.
test-latest: check-java
	@scripts/require-python "$(PYTHON)"
	@test -x $(LATEST)/bin/python || "$(PYTHON)" -m venv $(LATEST)
	@$(LATEST)/bin/python -m pip install --quiet --upgrade pip
	@$(LATEST)/bin/python -m pip install --quiet --upgrade --upgrade-strategy eager -e '.[$(EXTRAS)]'
	@$(LATEST)/bin/python scripts/versions-against-lock $(LOCK)
	@scripts/require-chromium
	@$(LATEST)/bin/ruff check --quiet .
	@$(LATEST)/bin/mypy
	@$(LATEST)/bin/python -m pytest -q

# Refresh the lock from pyproject.toml's ranges (every extra, every platform, Python 3.11 on),
# with uv's resolver; then run `make test` (the lock) and `make test-latest`.
lock: $(STAMP)
	@$(BIN)/python -m pip install --quiet uv
	@$(BIN)/uv pip compile pyproject.toml --universal --python-version 3.11 --no-header \
		$(foreach e,$(subst $(comma), ,$(EXTRAS)) bench,--extra $(e)) --upgrade -o $(LOCK)
	@echo "$(LOCK) refreshed: review the diff, then make test and make test-latest"

# The documentation site into site/, every warning an error (tests/test_docs.py builds it too).
docs: $(STAMP)
	@NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	@echo "documentation: site/index.html"

lint: $(STAMP)
	@$(BIN)/ruff check .

# Every benchmarks/bench_*.py, as a module; `make bench BENCH_ARGS=--quick` runs the small versions.
BENCH_ARGS ?=
bench: $(BENCH_STAMP) check-java
	@for b in benchmarks/bench_*.py; do \
		m=benchmarks.$$(basename $$b .py); echo "== python -m $$m $(BENCH_ARGS)"; \
		$(BIN)/python -m $$m $(BENCH_ARGS) || exit 1; \
	done

clean-venv:
	rm -rf $(VENV) $(LATEST)
