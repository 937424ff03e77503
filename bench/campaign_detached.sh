#!/usr/bin/env bash
# A campaign (bench/campaign.py) run detached on a lent GPU host, so that it trains while later device calls carry
# packages (Transformer Engine's pieces) and poll. Usage, in the project root:
#
#   bash bench/campaign_detached.sh start CAMPAIGN OUT [READY_FILE] [-- campaign.py options...]
#       The first pass now (targets whose package is missing are held back), then, once READY_FILE exists (for
#       example /tmp/te/done, written when Transformer Engine is installed), a second pass that runs them. Detached
#       with setsid: it outlives the call that started it. Logs: OUT.pass1.log, OUT.pass2.log, OUT.passes.
#   bash bench/campaign_detached.sh poll OUT [SECONDS] [PACK]
#       Wait up to SECONDS (default 0) for both passes to end (or the first to end while the second waits for its
#       READY_FILE), print where they stand and the records so far, and,
#       given PACK (a .tgz path, e.g. $OUT/camp.tgz), pack OUT into it to bring back. OUT holds each finished
#       job's record as soon as it ends (campaign.py copies them while Snakemake runs). Exit 3 at once where no
#       campaign was started on this machine.
#
# The campaign runs under $PYTHON (default: python3 on PATH), which needs the project's packages (snakemake, yaml).
#
# OUT must lie where the device's copy of the working tree is left alone between calls (an ignored path such as
# results/campaign/NAME). Pass `--code COMMIT` among the campaign's options: its jobs then run that commit's files
# from a checkout under results/code/, which the tree's sync leaves alone; without it no file of the tree may change
# between the calls while a pass runs (a job starting while the tree is replaced reads half of it: 2026-11-26, a
# record naming no code).
set -u
cmd=${1:?usage: bash bench/campaign_detached.sh start|poll ...}
shift
case "$cmd" in
start)
    camp=${1:?CAMPAIGN}; out=${2:?OUT}; shift 2
    ready=""
    if [ $# -gt 0 ] && [ "$1" != "--" ]; then ready=$1; shift; fi
    [ "${1:-}" = "--" ] && shift
    mkdir -p "$(dirname "$out")"
    : > "$out.passes"
    # this script again, as the passes, in a session of its own: it outlives the call that started it
    setsid nohup bash "$0" passes "$camp" "$out" "$ready" "$@" > /dev/null 2>&1 < /dev/null &
    echo "started: $camp into $out (detached)${ready:+; a second pass once $ready exists}"
    ;;
passes)  # (internal) the first pass, then the second once READY_FILE exists
    camp=$1; out=$2; ready=$3; shift 3
    py=${PYTHON:-python3}
    "$py" bench/campaign.py "$camp" --out "$out" "$@" > "$out.pass1.log" 2>&1
    echo "pass1 $? $(date -u +%T)" >> "$out.passes"
    if [ -n "$ready" ]; then
        [ -e "$ready" ] || echo "waiting for $ready" >> "$out.passes"
        while [ ! -e "$ready" ]; do sleep 3; done
        "$py" bench/campaign.py "$camp" --out "$out" "$@" > "$out.pass2.log" 2>&1
        echo "pass2 $? $(date -u +%T)" >> "$out.passes"
    fi
    echo "done $(date -u +%T)" >> "$out.passes"
    ;;
poll)
    out=${1:?OUT}; wait_s=${2:-0}; pack=${3:-}
    # no campaign was started here: a fresh machine (a lent one goes back when a call does not follow the last
    # within its idle time), whose poll must not spend its wait on nothing (2026-11-27: 520 s of four GPUs)
    if [ ! -e "$out.passes" ]; then
        echo "no campaign on this machine: $out.passes is missing (not the machine that ran 'start'; start it again)"
        exit 3
    fi
    end=$((SECONDS + wait_s))
    # until both passes end, or the first has ended and the second waits for a READY_FILE that does not exist yet
    settled() {
        local last
        last=$(tail -n 1 "$out.passes" 2>/dev/null)
        case "$last" in
            done*) return 0 ;;
            "waiting for "*) [ ! -e "${last#waiting for }" ] ;;
            *) return 1 ;;
        esac
    }
    while [ $SECONDS -lt $end ] && ! settled; do sleep 2; done
    date -u +%T
    cat "$out.passes" 2>/dev/null
    for log in "$out.pass1.log" "$out.pass2.log"; do
        [ -f "$log" ] && { echo "== $log"; grep -E 'Finished jobid|Error in rule|held back|^campaign ' "$log" | tail -8; }
    done
    # a pass that failed: the end of its log
    for n in 1 2; do
        grep -qE "^pass$n [1-9]" "$out.passes" 2>/dev/null && { echo "== pass $n failed:"; tail -n 15 "$out.pass$n.log"; }
    done
    echo "records: $(find "$out" -name metrics.json 2>/dev/null | wc -l)"
    command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
    if [ -n "$pack" ] && [ -d "$out" ]; then
        tar czf "$pack" -C "$(dirname "$out")" "$(basename "$out")" && ls -la "$pack"
    fi
    ;;
*)
    echo "usage: bash bench/campaign_detached.sh start|poll ..." >&2
    exit 2
    ;;
esac
