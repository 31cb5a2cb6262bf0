# The README's two commands: `make demo` and `make test`. Each creates .venv and installs what
# it needs when missing, so both work on a fresh clone with only Python 3.11+ and Java 17+.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: demo test docs lint bench clean-venv check-java

$(STAMP): pyproject.toml
	@scripts/require-python "$(PYTHON)"
	@test -x $(BIN)/python || "$(PYTHON)" -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --upgrade pip
	@$(BIN)/python -m pip install --quiet -e '.[test,docs,paimon,delta,iceberg,kafka,prometheus]'
	@touch $(STAMP)

$(BENCH_STAMP): $(STAMP)
	@$(BIN)/python -m pip install --quiet -e '.[test,bench]'
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
	rm -rf $(VENV)
