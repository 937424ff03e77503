#!/usr/bin/env bash
# The measurement check on one GPU, in parts (all by default), each with the full configs' window (30 steps or
# more, at least 20 s, 3 repeats):
#   c         Study C `pinned` and `sync-free` (SD 1.5, 512 px, batch 1)
#   b         Qwen3-8B `lora-efficient` (japanese_alpaca, batch 4)
#   a         Study A `fixed-compile` (the whole LLaVA-NeXT-7B, batch 1; bench/study_a_full.yaml)
#   a-limit   Study A `bf16` and `compile` at full scale, batch 1: `compile` (text length varying) is bounded
#             at 5 minutes and ends as a `timeout` record with its recompile count; bf16 completes beside it
#   a-workers Study A at full scale, batch 1, with the AnyRes preprocessing in 4 loader workers (pinned):
#             `fixed-compile-workers`, `bucketed-regional-workers` (regional compilation), `bf16-workers`
#   slots     two single-GPU jobs at once on a host with 2 GPUs (Qwen3-8B lora and qlora, japanese_alpaca, batch
#             4: the one-GPU side of `scale`): each must record its own GPU's UUID; prints UUID, end and train time
#   scale     several GPUs (2 or more; bench/scale_out.yaml), after `slots`: data parallel over two (lora-ddp2,
#             qlora-ddp2) and FSDP2 (lora-fsdp2) at the same per-GPU batch as `slots`' one-GPU runs
#   scale-32b Qwen3-32B at full scale (65.5 GB of bf16 weights), wikipedia_ja, batch 2 per GPU: lora on one GPU
#             against lora-fsdp2 on two (bench/scale_out_32b.yaml: 10-step repeats, still >= 20 s each)
#   scale-wiki Qwen3-8B wikipedia_ja lora on one GPU and lora-ddp2 at batch 2 per GPU
#   gpu-kind  the pair of runs that compares GPU kinds in the report (issue 12): Qwen3-8B lora, qlora, unsloth-qlora at
#             batch 4 on both datasets, and Study A bf16 and fixed-compile at full scale, batch 1 (Unsloth installed)
#   overhead  the harness's own overhead (bench/meter_overhead.py)
#   varlen    the rungs that drop the attention mask: Qwen3-8B `lora-pf-varlen-compile` (wikipedia_ja, batch 2, 4
#             and 8) beside `lora-pf-compile` at batch 4, and Study A `bucketed-regional-workers-causal` at full
#             scale, batch 1 and 4, beside `bucketed-regional-workers` and `bf16` (batch 1)
#   ladder    Study B's technique ladder on Qwen3-8B, wikipedia_ja (<= 2048 tokens), in one lease: its rungs (lora,
#             lora-efficient, lora-pf, lora-pf-compile, lora-pf-varlen-compile, lora-pf-varlen-fp8-compile) at
#             batch 2, then the last two at 4 (~16 min on an H100)
#   fp8       the FP8 rung on top of the ladder's top rung (lora-pf-varlen-fp8-compile: torchao float8 GEMMs on the
#             frozen base) at batches 2 and 4, beside lora-pf-varlen-compile at 4
#   ladder-beside  the variants beside the ladder at batch 2 (lora-pf-liger, lora-pf-liger-compile,
#             lora-padding-free; Liger Kernel must be installed: pip install liger-kernel==0.8.5), and the two
#             compiled rungs at batches 4 and 8
#   b32-alpaca, b32-wiki, oss-alpaca, oss-wiki
#             Study B's published table at full scale (issue 24; bench/study_b_full.yaml: 2 repeats of >= 8 steps):
#             Qwen3-32B at batch 32 and gpt-oss-120b at 32 (japanese_alpaca) and 16 (wikipedia_ja), built in the
#             training process; unsloth-qlora (written as a 4-bit checkpoint in the job's temporary folder for
#             Unsloth's from_pretrained, or the measured reason that route failed) and
#             the same 4-bit model through PEFT (qlora-gc-pf: packed rows, variable-length attention, gpt-oss's
#             sinks folded in), then its profile. One call each
#   oss-alpaca-grouped, oss-wiki-grouped  the same with gpt-oss's experts as one grouped GEMM per projection per
#             layer (qlora-gc-pf-grouped, issue 35: the per-expert loop's ~10^5 launches a step), Unsloth beside
#   b32-beside Qwen3-32B lora and qlora at batches 1 and 2 (the largest that fits), both datasets
#   b32-wiki-bf16  Qwen3-32B wikipedia_ja bs32 with the non-quantized parameters kept in bf16 (qlora-gc-pf-bf16, as
#             Unsloth keeps them; PEFT's fp32 copies cost 6.2 GB): does the study's H100 hold it then?
#   sink-check gpt-oss's attention with sinks through the flash kernel against its eager attention, values and
#             gradients, at its head layout (bench/sink_check.py; seconds): before oss-wiki and oss-alpaca
#   frontier-a ... frontier-e, frontier-profile, frontier-profile-async
#             the frontier past the ladder (issue 26; Qwen3-8B, wikipedia_ja, LoRA r=8 on the seven projections):
#             a: rung 0 (lora-pf-varlen-compile at 4), lora-tb and lora-tb-cg at 1 (rows of 4,096 tokens);
#             b: lora-tb-cg-lean at 1, lora-tb-cg-lean-fused at 1 and 2; c: lora-tb8k-cg-lean-fused-offload at 1
#             and 2 (rows of 8,192), -sac (selective checkpointing) at 1, lora-tb-cg-lean-fp8 at 1 (~2.3-2.5 min a
#             run on the H100, 2026-11-25: each part ~8-10 min); then the top rung's profile;
#             d: lora-tb-cg-lean-fused-async at 2 (no host sync between steps), beside lora-tb-cg-lean-fused at 2 (the
#             rung below, same machine) and lora-tb at 2 (rung 0's step on the same rows: the loss on the same tokens);
#             frontier-profile-async: its profile with FTBENCH_SYNC_DEBUG=1 (the syncs left, by site);
#             e: lora-tb-cg-lean-fused-async-pinned at 2 (the batch copied from pinned memory, non-blocking) beside
#             rung 5 and lora-tb at 2, on the same machine;
#             f: FP8 on rung 5 (torchao float8 on the frozen base, tensorwise and rowwise) beside rung 5 and lora-tb at
#             2 (the loss on the same tokens, issue 37); g: FP8 on rung 6 beside rung 6
#   a-eager-bsN[,M..], a-fixed-bsN[,M..], a-dynamic-bsN[,M..]
#             Study A's seven variants at full scale with gradient checkpointing (issue 25; bench/study_a_sweep.yaml),
#             at the batch sizes named: eager (bf16-gc, fp8-te-gc, qlora-gc), fixed shape + compile
#             (fixed-compile-gc, fp8-te-fixed-compile-gc), plain compile (compile-gc, fp8-te-compile-gc: 180 s
#             limit). FP8 needs Transformer Engine (../shared/device/transformer-engine.sh). One call each
#   a-cell-VARIANT-bsN[,M..]  one of those variants alone at the batch sizes named (the cells still missing)
#   a-profile-VARIANT-bsN[,M..]  its profile (bench/study_a_sweep.yaml's profile list: bf16-gc, fp8-te-gc and
#             fp8-te-compile-gc at 1 and 8; GEMMs against FP8 casts and scaling, issue 36)
#   c-cell-VARIANT[,VARIANT..], c-profile-VARIANT[,VARIANT..]
#             Study C at full scale as the study ran it (config/study_c_random.yaml: images of the dataset's size,
#             1024 px JPEGs decoded and cropped to 512 px in the loader; 3 repeats): the variants' runs, or their
#             profiles (issue 34)
# Usage, in the project root: bash bench/measure_check.sh [OUTDIR [PART...]]   (records stay under results/runs/)
set -u
out=${1:-results/measure_check}
shift || true
parts=${*:-c b a a-limit overhead}
mkdir -p "$out"
# greedy: one GPU job at a time needs no ILP solver (pulp need not travel to a lent GPU)
sm() { ${SNAKEMAKE:-python3 -m snakemake} --cores 16 --resources gpu=1 --keep-going --scheduler greedy "$@"; }
sm2() { ${SNAKEMAKE:-python3 -m snakemake} --cores 32 --resources gpu=2 --keep-going "$@"; }  # a 2-GPU host
lmm=results/runs/lmm/llava-v1.6-mistral-7b/full/beans
for part in $parts; do
  echo "== $part $(date -u +%FT%TZ)"
  case $part in
    c) sm --configfile config/study_c_random.yaml -- \
         results/runs/diffusion/stable-diffusion-v1-5/full/naruto/{pinned,sync-free}/bs1/metrics.json ;;
    b) sm --configfile config/study_b_random.yaml -- \
         results/runs/llm/qwen3-8b/full/japanese_alpaca/lora-efficient/bs4/metrics.json ;;
    a) sm --configfile config/study_a_random.yaml bench/study_a_full.yaml -- "$lmm/fixed-compile/bs1/metrics.json" ;;
    a-limit) sm --configfile config/study_a_random.yaml bench/study_a_full.yaml -- \
         "$lmm/bf16/bs1/metrics.json" "$lmm/compile/bs1/metrics.json" ;;
    a-workers) sm --configfile config/study_a_random.yaml bench/study_a_full.yaml -- \
         $lmm/{fixed-compile-workers,bucketed-regional-workers,bf16-workers}/bs1/metrics.json ;;
    slots) llm=results/runs/llm/qwen3-8b/full/japanese_alpaca
       sm2 --configfile config/study_b_random.yaml bench/scale_out.yaml -- $llm/{lora,qlora}/bs4/metrics.json
       for f in $llm/{lora,qlora}/bs4/metrics.json; do
         python3 -c "import json,sys; d=json.load(open(sys.argv[1])); p=d['provenance']
print(sys.argv[1], d['status'], p['device']['uuid'], 'ended', p['timestamp'], 'train_s', d['timing']['train_s'])" "$f"
       done ;;
    scale) llm=results/runs/llm/qwen3-8b/full/japanese_alpaca
       sm2 --configfile config/study_b_random.yaml bench/scale_out.yaml -- \
         $llm/{lora-ddp2,lora-fsdp2,qlora-ddp2}/bs4/metrics.json ;;
    scale-32b) llm=results/runs/llm/qwen3-32b/full/wikipedia_ja
       sm2 --configfile config/study_b_random.yaml bench/scale_out.yaml bench/scale_out_32b.yaml -- \
         $llm/{lora,lora-fsdp2}/bs2/metrics.json ;;
    scale-wiki) llm=results/runs/llm/qwen3-8b/full/wikipedia_ja
       sm2 --configfile config/study_b_random.yaml bench/scale_out.yaml -- $llm/{lora,lora-ddp2}/bs2/metrics.json ;;
    gpu-kind) sm --configfile config/study_b_random.yaml -- \
         results/runs/llm/qwen3-8b/full/{japanese_alpaca,wikipedia_ja}/{lora,qlora,unsloth-qlora}/bs4/metrics.json
       sm --configfile config/study_a_random.yaml bench/study_a_full.yaml -- $lmm/{bf16,fixed-compile}/bs1/metrics.json ;;
    varlen) llm=results/runs/llm/qwen3-8b/full/wikipedia_ja
       sm --configfile config/study_b_random.yaml -- $llm/lora-pf-varlen-compile/bs{2,4,8}/metrics.json \
         $llm/lora-pf-compile/bs4/metrics.json
       sm --configfile config/study_a_random.yaml bench/study_a_full.yaml -- \
         $lmm/bucketed-regional-workers-causal/bs{1,4}/metrics.json $lmm/{bucketed-regional-workers,bf16}/bs1/metrics.json ;;
    overhead) python3 bench/meter_overhead.py ;;
    ladder) llm=results/runs/llm/qwen3-8b/full/wikipedia_ja
       sm --configfile config/study_b_random.yaml -- \
         $llm/{lora,lora-efficient,lora-pf,lora-pf-compile,lora-pf-varlen-compile,lora-pf-varlen-fp8-compile}/bs2/metrics.json \
         $llm/{lora-pf-varlen-compile,lora-pf-varlen-fp8-compile}/bs4/metrics.json ;;
    fp8) llm=results/runs/llm/qwen3-8b/full/wikipedia_ja
       sm --configfile config/study_b_random.yaml -- $llm/lora-pf-varlen-fp8-compile/bs{2,4}/metrics.json \
         $llm/lora-pf-varlen-compile/bs4/metrics.json ;;
    ladder-beside) llm=results/runs/llm/qwen3-8b/full/wikipedia_ja
       sm --configfile config/study_b_random.yaml -- \
         $llm/{lora-pf-liger,lora-pf-liger-compile,lora-padding-free}/bs2/metrics.json \
         $llm/{lora-pf-compile,lora-pf-varlen-compile}/bs{4,8}/metrics.json ;;
    b32-alpaca|b32-wiki|oss-alpaca|oss-wiki|b32-wiki-bf16|oss-alpaca-grouped|oss-wiki-grouped)
       case $part in
         oss-alpaca-grouped) m=gpt-oss-120b d=japanese_alpaca v=qlora-gc-pf-grouped b=32 ;;
         oss-wiki-grouped) m=gpt-oss-120b d=wikipedia_ja v=qlora-gc-pf-grouped b=16 ;;
         b32-wiki-bf16) m=qwen3-32b d=wikipedia_ja v=qlora-gc-pf-bf16 b=32 ;;
         b32-alpaca) m=qwen3-32b d=japanese_alpaca v=qlora-gc-pf b=32 ;;
         b32-wiki) m=qwen3-32b d=wikipedia_ja v=qlora-gc-pf b=32 ;;
         oss-alpaca) m=gpt-oss-120b d=japanese_alpaca v=qlora-gc-pf b=32 ;;
         oss-wiki) m=gpt-oss-120b d=wikipedia_ja v=qlora-gc-pf b=16 ;;
       esac
       sm --configfile config/study_b_random.yaml bench/study_b_full.yaml -- \
         results/runs/llm/$m/full/$d/{unsloth-qlora,$v}/bs$b/metrics.json
       sm --configfile config/study_b_random.yaml bench/study_b_full.yaml -- \
         results/profiles/llm/$m/full/$d/$v/bs$b/summary.json ;;
    a-cell-*|a-profile-*)  # one variant of Study A's sweep at the batch sizes named: its runs, or its profiles
       v=${part#a-*-}; v=${v%-bs*}
       sm --configfile config/study_a_random.yaml bench/study_a_sweep.yaml -- \
         $(for bs in $(echo "${part##*-bs}" | tr , ' '); do case $part in
             a-cell-*) echo "$lmm/$v/bs$bs/metrics.json" ;;
             *) echo "results/profiles/lmm/llava-v1.6-mistral-7b/full/beans/$v/bs$bs/summary.json" ;; esac; done) ;;
    c-cell-*|c-profile-*)
       sd=stable-diffusion-v1-5/full/naruto
       sm --configfile config/study_c_random.yaml -- $(for v in $(echo "${part#c-*-}" | tr , ' '); do
         case $part in c-cell-*) echo "results/runs/diffusion/$sd/$v/bs1/metrics.json" ;;
                       *) echo "results/profiles/diffusion/$sd/$v/bs1/summary.json" ;; esac; done) ;;
    a-eager-bs*|a-fixed-bs*|a-dynamic-bs*)
       group=${part#a-}; group=${group%%-*}
       case $group in
         eager) vs="bf16-gc fp8-te-gc qlora-gc" ;;
         fixed) vs="fixed-compile-gc fp8-te-fixed-compile-gc" ;;
         dynamic) vs="compile-gc fp8-te-compile-gc" ;;
       esac
       targets=()
       for bs in $(echo "${part##*-bs}" | tr , ' '); do
         for v in $vs; do targets+=("$lmm/$v/bs$bs/metrics.json"); done
       done
       sm --configfile config/study_a_random.yaml bench/study_a_sweep.yaml -- "${targets[@]}" ;;
    sink-check) python3 bench/sink_check.py ;;
    frontier-a|frontier-b|frontier-c|frontier-d|frontier-e|frontier-f|frontier-g|frontier-profile|frontier-profile-async)
       llm=results/runs/llm/qwen3-8b/full/wikipedia_ja
       case $part in
         frontier-a) targets="$llm/lora-pf-varlen-compile/bs4 $llm/lora-tb/bs1 $llm/lora-tb-cg/bs1" ;;
         frontier-b) targets="$llm/lora-tb-cg-lean/bs1 $llm/lora-tb-cg-lean-fused/bs1 $llm/lora-tb-cg-lean-fused/bs2" ;;
         frontier-c) targets="$llm/lora-tb8k-cg-lean-fused-offload/bs1 $llm/lora-tb8k-cg-lean-fused-offload/bs2
                              $llm/lora-tb8k-cg-lean-fused-sac/bs1 $llm/lora-tb-cg-lean-fp8/bs1" ;;
         frontier-d) targets="$llm/lora-tb-cg-lean-fused-async/bs2 $llm/lora-tb-cg-lean-fused/bs2 $llm/lora-tb/bs2" ;;
         frontier-e) targets="$llm/lora-tb-cg-lean-fused-async-pinned/bs2 $llm/lora-tb-cg-lean-fused-async/bs2
                              $llm/lora-tb/bs2" ;;
         frontier-f) targets="$llm/lora-tb-cg-lean-async-fp8/bs2 $llm/lora-tb-cg-lean-async-fp8-rowwise/bs2
                              $llm/lora-tb-cg-lean-fused-async/bs2 $llm/lora-tb/bs2" ;;
         frontier-g) targets="$llm/lora-tb-cg-lean-async-pinned-fp8/bs2 $llm/lora-tb-cg-lean-fused-async-pinned/bs2" ;;
         frontier-profile|frontier-profile-async) targets="" ;;
       esac
       if [ -n "$targets" ]; then  # one at a time, in the order listed (what matters most first)
         for t in $targets; do sm --configfile config/study_b_random.yaml -- "$t/metrics.json"; done
       else  # the profile; the sync-free rung's with the host syncs its steps still make, counted by site
         v=lora-tb-cg-lean-fused debug=0
         [ "$part" = frontier-profile-async ] && v=$v-async debug=1
         FTBENCH_SYNC_DEBUG=$debug sm --configfile config/study_b_random.yaml -- \
           results/profiles/llm/qwen3-8b/full/wikipedia_ja/$v/bs2/summary.json
       fi ;;
    b32-beside) sm --configfile config/study_b_random.yaml bench/study_b_full.yaml -- \
         results/runs/llm/qwen3-32b/full/{japanese_alpaca,wikipedia_ja}/{lora,qlora}/bs{1,2}/metrics.json ;;
    *) echo "unknown part: $part" >&2; exit 2 ;;
  esac > "$out/${part//,/_}.log" 2>&1
  echo "   exit $? $(date -u +%FT%TZ)"
done
