#!/usr/bin/env bash
# A part run detached on a lent host, from a copy of the tree in /tmp/ftb (records from earlier stages kept there),
# so that the calls after it can carry other folders while it runs:
#   bash bench/stage.sh PART [PYTHONPATH]      its log: /tmp/ftb/mc/PART.log; the stage's own output: /tmp/stage-PART.out
# A lent machine goes back 30 s after a call ends: chain the next call at once, and let polls sleep inside a call.
set -u
part=$1
mkdir -p /tmp/ftb && tar --exclude=./.venv --exclude=./results --exclude=./logs --exclude=./.snakemake -cf - . | tar -xf - -C /tmp/ftb
cd /tmp/ftb && PYTHONPATH=${2:-/tmp/site} nohup setsid bash bench/measure_check.sh mc "$part" > "/tmp/stage-$part.out" 2>&1 < /dev/null &
echo "started $part in /tmp/ftb"
