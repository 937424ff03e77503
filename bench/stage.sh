#!/usr/bin/env bash
# A part run detached on a lent host, from a copy of the tree in /tmp/ftb (records from earlier stages kept there),
# so that the calls after it can carry other folders while it runs:
#   bash bench/stage.sh PART [PYTHONPATH [GPU]]  its log: /tmp/ftb/mc/PART.log; the stage's own output: /tmp/stage-PART.out
# GPU (an index): the part's jobs train on that card alone (FTBENCH_GPU_IDS), from their own copy of the tree,
# /tmp/ftbGPU: two parts on two cards of one host each keep their rungs on one card, so that each ratio to the rung
# below divides runs of one card. Then `bash bench/poll.sh SECONDS OUT` waits for them and packs their records.
# A lent machine goes back 30 s after a call ends: chain the next call at once, and let polls sleep inside a call.
set -u
part=$1
gpu=${3:-}
tree=/tmp/ftb$gpu
mkdir -p "$tree" && tar --exclude=./.venv --exclude=./results --exclude=./logs --exclude=./.snakemake \
  --exclude=./.device-wheels -cf - . | tar -xf - -C "$tree"
cd "$tree" && env PYTHONPATH="${2:-/tmp/site}" ${gpu:+FTBENCH_GPU_IDS=$gpu} nohup setsid bash bench/measure_check.sh mc "$part" \
  > "/tmp/stage-$part.out" 2>&1 < /dev/null &
echo "started $part in $tree${gpu:+ on GPU $gpu}"
