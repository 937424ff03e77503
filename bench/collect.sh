#!/usr/bin/env bash
# Pack what a lent GPU's runs left (records, step and memory logs, profile summaries, job logs; not traces or
# adapters) into OUT/records.tar.gz, to bring back from the machine. Usage: bash bench/collect.sh OUT
set -u
out=${1:?usage: bash bench/collect.sh OUT}
mkdir -p "$out"
find results/runs results/profiles results/models logs -type f \( -name metrics.json -o -name steps.csv \
  -o -name memory.csv -o -name 'summary*.json' -o -name model.json -o -name '*.log' -o -name reload.json -o -name gathered.json \) 2>/dev/null \
  | tar czf "$out/records.tar.gz" -T -
ls -la "$out/records.tar.gz"
