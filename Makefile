# Two entry points: `make report` (install, run the default pipeline, build report.html) and
# `make test` (install, run the test suite). Both create .venv themselves on a fresh machine.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
CORES ?= 2

.PHONY: install report run test lint clean

$(BIN)/snakemake: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and pinned, so nothing below pulls another build with its CUDA packages
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

install: $(BIN)/snakemake

run: install
	$(BIN)/snakemake --cores $(CORES) --resources gpu=1

report: run
	$(BIN)/snakemake --report report.html
	@echo "report: $(CURDIR)/report.html"

# two workers, one test file each at a time: the end-to-end pipeline (tests/test_pipeline.py, scheduled first)
# runs beside the rest of the suite
test: install
	$(BIN)/pytest -q -n $(CORES) --dist loadfile

lint: install
	$(BIN)/snakemake --lint

clean:
	rm -rf results logs benchmarks .snakemake report.html
