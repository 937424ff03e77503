#!/usr/bin/env bash
# The measurement check on one GPU, in parts: the parts are data (bench/parts.yaml), run by bench/measure_check.py.
# Usage, in the project root: bash bench/measure_check.sh [OUTDIR [PART...]]   (records stay under results/runs/)
#   bash bench/measure_check.sh --list      the parts and what each measures
exec python3 "$(dirname "$0")/measure_check.py" "$@"
