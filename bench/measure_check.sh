#!/usr/bin/env bash
# The measurement check on one GPU: Study C `pinned` and `sync-free` (SD 1.5, 512 px), Qwen3-8B `lora-efficient`
# (japanese_alpaca, batch 4) and Study A `fixed-compile` (full LLaVA-NeXT-7B, batch 1), each with the full
# configs' window (30 steps or more, at least 20 s, 3 repeats), then the harness's own overhead.
# Usage, in the project root: bash bench/measure_check.sh [OUTDIR]   (records stay under results/runs/)
set -u
out=${1:-results/measure_check}
mkdir -p "$out"
sm() { ${SNAKEMAKE:-python3 -m snakemake} --cores 16 --resources gpu=1 "$@"; }
sm --configfile config/study_c_random.yaml -- \
   results/runs/diffusion/stable-diffusion-v1-5/full/naruto/{pinned,sync-free}/bs1/metrics.json > "$out/study_c.log" 2>&1
sm --configfile config/study_b_random.yaml -- \
   results/runs/llm/qwen3-8b/full/japanese_alpaca/lora-efficient/bs4/metrics.json > "$out/study_b.log" 2>&1
sm --configfile config/study_a_random.yaml \
   --config 'models={"llava-v1.6-mistral-7b": {"architecture": "llava-v1.6-mistral-7b.yaml", "source": "random", "scale": "full"}}' \
   -- results/runs/lmm/llava-v1.6-mistral-7b/full/beans/fixed-compile/bs1/metrics.json > "$out/study_a.log" 2>&1
python3 bench/meter_overhead.py > "$out/overhead.txt" 2>&1
echo done > "$out/DONE"
