"""Causal-LM runner: TRL's SFTTrainer, as users train, with the harness attached as a callback."""

from __future__ import annotations

import math
import shutil
import time

import torch

from ftbench.build import attention, fp8, head, parallel, route
from ftbench.data import heldout, packing
from ftbench.build.head import fused_head_available
from ftbench.run.profiling import SyncWatch
from ftbench.build.stages import restore_renamed, write_4bit_checkpoint
from ftbench.harness.flops import causal_lm_shape, step_flops
from ftbench.build.variants import (DTYPE_NAMES, adapted_modules, checkpoint_kwargs, compile_kwargs, compile_model, compute_dtype,
                        cuda_graphs, parameter_counts, precision_ran, quantization_config)
from ftbench.run.runners.served import served_twin
from ftbench.run.runners.peers import (import_unsloth, nemo_model, peer_record, save_nemo_adapter,
                                       unsloth_checkpoint_routes, unsloth_flash_impl, unsloth_targets)


def load_model(ctx, device):
    """The model and its tokenizer: Unsloth's and NeMo AutoModel's built their own way, every other by
    `route.build_causal_lm` (one GPU or sharded; from the checkpoint, in process or with an FP8 base), with the
    variant's precision and adapters applied; with how it was built and the FP8 conversion's summary."""
    v, path, lora = ctx.variant, ctx.manifest["path"], ctx.settings.lora
    in_process = ctx.manifest.get("build") == "in_process"
    if v.framework == "unsloth":
        from unsloth import FastLanguageModel  # imported first: Unsloth patches transformers

        build = {"method": "checkpoint (Unsloth's from_pretrained)"}
        routes = unsloth_checkpoint_routes() if in_process else []
        try:
            if in_process:  # the same seeded weights, in NF4, through a checkpoint Unsloth can read
                build = write_4bit_checkpoint(ctx.manifest, ctx.settings.seed, device, routes, quantization_config(v))
                path = build["checkpoint_path"]
            model, tokenizer = FastLanguageModel.from_pretrained(
                path, max_seq_length=ctx.settings.max_seq_length, dtype=compute_dtype(v),
                load_in_4bit=v.precision == "nf4")
            if in_process:  # what Unsloth's classes name otherwise gets the seeded tensor too, or is named
                build["unsloth_load"] = restore_renamed(model, path)
        finally:  # the checkpoint is read: its folders go (one in host memory would hold the host's RAM)
            for folder, _ in routes:
                shutil.rmtree(folder, ignore_errors=True)
        build["unsloth_target_modules"] = targets = unsloth_targets(v, lora, model.config)
        model = FastLanguageModel.get_peft_model(
            model, r=lora.get("r", 8), lora_alpha=lora.get("alpha", 16), lora_dropout=lora.get("dropout", 0.0),
            target_modules=targets, bias="none", random_state=3407,
            use_gradient_checkpointing="unsloth" if v.gradient_checkpointing else False)
        # LoRA's A from the same per-name seeded draws as PEFT's rungs (B zero): Unsloth starts where they start, so
        # its loss on the same rows compares step by step
        build["adapters_seeded"] = parallel.seed_adapters(model, ctx.settings.seed)
        return model, tokenizer, {"build": build}
    if v.framework == "nemo":
        return nemo_model(ctx, lora)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    # attention: transformers' default for the architecture (SDPA where supported; gpt-oss has none)
    model, info = route.build_causal_lm(ctx.manifest, ctx.settings.seed, device, v, lora)
    return model, tokenizer, info


def trainer_compile_args(variant) -> dict:
    """The trainer's torch.compile settings: only for a whole-model compile. TrainingArguments turns
    `torch_compile` on whenever a compile mode or backend is set, so layers-scope variants (their blocks
    compiled in place above) must pass neither, or the trainer compiles the whole model on top."""
    if not variant.compile or variant.compile_scope != "model":
        return {}
    return {"torch_compile": True, "torch_compile_backend": variant.compile_backend,
            "torch_compile_mode": compile_kwargs(variant).get("mode")}


def batch_sequences(input_ids, attention_mask, position_ids, pad_id=None) -> tuple[list[int], list[int]]:
    """(length of each sequence as computed, its real unpadded length) in one micro-batch. A padding-free
    batch (Unsloth turns it on) is one row of concatenated sequences whose position ids restart at 0 for each;
    where the collator padded that row to a multiple (`pad_id` given), its trailing pad tokens (position 0
    each) are computed, not counted as sequences. Reads tensor values: call it once the measured window has
    synchronised."""
    if input_ids.shape[0] == 1 and position_ids is not None:
        n = end = input_ids.shape[1]
        if pad_id is not None:  # the length of the trailing run of pad tokens at position 0
            end = n - attention.trailing_pads(input_ids[0], position_ids[0], pad_id)
        starts = (position_ids[0, :end] == 0).nonzero().flatten().tolist() + [end]
        if len(starts) > 2:
            lens = [b - a for a, b in zip(starts, starts[1:])]
            return lens + [1] * (n - end), lens
    padded = [input_ids.shape[1]] * input_ids.shape[0]
    real = attention_mask.sum(1).tolist() if attention_mask is not None else padded
    return padded, [int(r) for r in real]


def document_mask(position_ids):
    """The attention mask of a padding-free row: token i sees token j when both lie in the same sequence
    (position ids restart at 0 at each) and j <= i, as (batch, 1, T, T) booleans. transformers' SDPA and eager
    attention do not derive it from the position ids themselves: without it the sequences of a row attend to
    each other (tests/test_runner.py)."""
    import torch

    doc = (position_ids == 0).cumsum(-1)
    t = position_ids.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=position_ids.device).tril()
    return ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]


def truncate(ds, length: int):
    """A tokenized dataset with every per-token column cut to `length` tokens."""
    return ds.map(lambda ex: {k: x[:length] for k, x in ex.items()
                              if isinstance(x, list) and len(x) == len(ex["input_ids"])})


def pad_multiple(variant, settings, batch_size: int = 1) -> int | None:
    """What each batch's length is padded up to a multiple of: nothing (dynamic padding), a bucket size
    (bucketed: few distinct shapes, for compilers and per-shape kernel plans), the fixed length, or a token
    budget's whole row (B rows of `token_budget` tokens: one shape; not for Unsloth, whose packed attention takes the
    rows unpadded: a padded tail would be a sequence it is not told of); with FP8 GEMMs also a multiple of 16 (their
    shape rule; a padding-free row gets trailing pad tokens)."""
    multiple = {"bucketed": settings.bucket_multiple, "fixed": settings.fixed_length}.get(variant.shape_policy)
    if variant.token_budget and variant.framework != "unsloth":
        multiple = packing.row_tokens(batch_size, variant.token_budget)
    if variant.precision == "fp8":
        multiple = math.lcm(multiple or 1, fp8.ALIGN)
    return multiple


def fused_head_loss(model, inputs, num_items_in_batch=None, ranks: int = 1):
    """The loss TRL's SFTTrainer computes from its fused LM head (per-token log-probabilities in chunks, the full
    logits never formed), without its per-step entropy and token-accuracy metrics, which read two values back to
    the host every step (variant knob trainer_metrics: false). `ranks`: where `num_items_in_batch` counts the tokens
    of every rank (the Trainer's average_tokens_across_devices), the loss is multiplied by the number of ranks, as
    TRL and the Trainer do, because DDP and FSDP average the gradients over the ranks; without it each rank's
    gradient, and the logged loss, were 1/ranks of the one-GPU run's (before 2026-11-26's thirteenth session)."""
    outputs = model(**{**inputs, "use_cache": False}, fused_lm_head=True)
    num_tokens = outputs.label_mask.sum() if num_items_in_batch is None else num_items_in_batch
    return across_ranks((-outputs.log_probs).sum() / torch.as_tensor(num_tokens).clamp(min=1), num_items_in_batch,
                        ranks)


def head_forward_loss(model, inputs, num_items_in_batch=None, ranks: int = 1):
    """The loss of ftbench.build.head's two-GEMM LM head (variant knob lm_head), through the model's wrappers (DDP, PEFT)
    as TRL's fused head goes; `ranks` as in fused_head_loss."""
    loss = model(**{**inputs, "use_cache": False}, head_loss_on=True, num_items_in_batch=num_items_in_batch).loss
    return across_ranks(loss, num_items_in_batch, ranks)


def across_ranks(loss, num_items_in_batch, ranks: int):
    """A loss over every rank's token count (`num_items_in_batch`) times the number of ranks, which DDP and FSDP
    average the gradients over (fused_head_loss says why)."""
    return loss * ranks if num_items_in_batch is not None and ranks > 1 else loss


def sft_dataset(path, kind):
    from ftbench.data.datasets import read_split, sft_messages

    ds = read_split(path)
    return ds.map(lambda ex: {"messages": sft_messages(ex, kind)}, remove_columns=ds.column_names)


def train(ctx, record, device, meter):
    """Load, wrap, train with SFTTrainer for warm-up + measured windows, evaluate; fill the record."""
    if ctx.variant.framework == "unsloth":
        import_unsloth(ctx.variant)
    v = ctx.variant
    model, tokenizer, info, compute = setup_model(ctx, record, device, meter)
    multiple = pad_multiple(v, ctx.settings, ctx.spec.batch_size)
    args = trainer_args(ctx, compute, multiple, info, device)
    train_ds = sft_dataset(ctx.train_path, ctx.dataset["kind"])
    eval_ds = sft_dataset(ctx.eval_path, ctx.dataset["kind"])
    s = ctx.settings
    slots = packing.bound_slots(ctx.spec.batch_size, v.token_budget, s.max_seq_length) if v.token_budget else None
    curve = None
    if s.held_out_every_steps:  # the quality study: the text to be learned scored, as trained and as served
        kind = ctx.dataset["kind"]
        eval_ds = heldout.scored_split(eval_ds, tokenizer, kind)
        curve = heldout.HeldOutCurve(s.held_out_every_steps, served=served_twin(ctx, device, model),
                                     scored=heldout.SCORED[kind], last=(s.held_out_last_steps, s.max_steps))
    syncs = SyncWatch(device)
    trainer_cls = measured_trainer(v, s, device, tokenizer.pad_token_id, slots, curve)
    callback = harness_callback(record, meter, curve, syncs,
                                step_reader(model, tokenizer, v, multiple, record["model"]["trainable_parameters"]))
    callbacks = [callback]
    if v.fp8_until is not None:  # a bf16 tail: the frozen GEMMs in bf16 once the FP8 share of the steps is done
        callbacks.append(bf16_tail_callback(model, v.fp8_until, record))
    trainer = trainer_cls(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                          processing_class=tokenizer, callbacks=callbacks)
    callback.trainer = trainer
    prepare_trainer(trainer, model, ctx, record, tokenizer.pad_token_id, slots)
    if curve is not None:  # the pretrained model's held-out loss, before the first step
        curve.evaluate(trainer, 0)
    with syncs:
        trainer.train()
    meter.finish()
    record["extra"]["host_syncs"] = syncs.summary(meter.steps_taken)
    trained_record(trainer, model, ctx, record, args, multiple, slots, len(train_ds))
    with meter.eval():  # (with a held-out curve its last point is the evaluation: the same split, after the last step)
        record["loss"]["eval"] = (trainer.evaluate()["eval_loss"] if curve is None else curve.points[-1]["loss"])
    if curve is not None:
        record["loss"]["held_out"] = curve.summary()
    save_adapter(trainer, model, ctx, record)


def setup_model(ctx, record, device, meter):
    """The model built (or loaded) and wrapped as the variant asks: LoRA, FP8, fused projections, the attention
    path, compiled layers; what it is, in the record. Returns (model, tokenizer, build info, compute dtype's name)."""
    v = ctx.variant
    with meter.load():
        model, tokenizer, info = load_model(ctx, device)
    fp8_info = info.get("fp8") or {}
    total, trainable = parameter_counts(model)
    record["model"].update(parameters=total, trainable_parameters=trainable, adapted_modules=adapted_modules(model),
                           build=info.get("build"))
    compute = DTYPE_NAMES[compute_dtype(v)]
    record["precision"].update(precision_ran(model, compute, fp8_info.get("converted")))
    record["extra"]["fp8"] = fp8_info or None
    for key in ("fused_projections", "experts", "expert_lora"):
        record["extra"][key] = info.get(key)
    record["extra"]["trainer_args"] = info.get("trainer_args") or None  # the parallel strategy's trainer settings
    model.config.use_cache = False  # training keeps no KV cache (with one, compiled layers guard per layer index)
    if v.attention == "varlen":  # each sequence of the packed row attends on its own: no T x T mask
        attention.use_varlen(model)
        sinks = attention.has_sinks(model)
        if v.flash_impl:  # its flash kernels from another implementation (FlashAttention-4)
            if sinks:
                from ftbench.harness.meter import Unsupported

                raise Unsupported(f"flash_impl={v.flash_impl!r} with attention sinks (gpt-oss): the sinks are folded "
                                  "in through FlashAttention-2's log-sum-exp; not wired for another implementation")
            record["extra"]["flash_impl"] = attention.activate_flash(v.flash_impl)
        record["extra"]["attention_kernel"] = attention.kernel(device, sinks)
    if v.parallel == "ddp" and v.compile:  # DDP's bucket boundaries cut the compiled graphs only where asked
        torch._dynamo.config.optimize_ddp = bool(v.ddp_graph_split)  # (Dynamo's DDPOptimizer; knob ddp_graph_split)
        record["extra"]["ddp_graph_split"] = v.ddp_graph_split
    if v.compile_scope == "layers":  # the decoder layers compiled in place; the LM head and loss stay eager
        compile_model(model, v)
    return model, tokenizer, info, compute


def trainer_args(ctx, compute: str, multiple: int | None, info: dict, device):
    """TRL's SFTConfig for the run: the study's hyper-parameters, and each knob the variant sets."""
    from trl import SFTConfig

    s, v = ctx.settings, ctx.variant
    return SFTConfig(
        output_dir=str(ctx.spec.run_dir) + "/trainer", max_steps=s.max_steps,
        per_device_train_batch_size=ctx.spec.batch_size, per_device_eval_batch_size=ctx.spec.batch_size,
        gradient_accumulation_steps=s.gradient_accumulation_steps, learning_rate=s.learning_rate,
        optim=v.optim or s.optim, max_grad_norm=s.max_grad_norm, bf16=compute == "bf16", fp16=compute == "fp16",
        # padding-free: TRL refuses a max_length it would not enforce; the datasets are truncated below instead
        max_length=None if v.padding_free else s.max_seq_length, logging_steps=s.logging_steps,
        save_strategy="no", eval_strategy="no", report_to="none", seed=s.seed, data_seed=s.seed,
        dataloader_num_workers=v.dataloader_workers, dataloader_pin_memory=v.pin_memory,
        dataloader_persistent_workers=v.dataloader_workers > 0,
        # TRL's SFTConfig turns gradient checkpointing on by default: the variant decides, explicitly
        # (Unsloth applies its own in get_peft_model).
        gradient_checkpointing=v.gradient_checkpointing and v.framework != "unsloth",
        gradient_checkpointing_kwargs=checkpoint_kwargs(v),
        pad_to_multiple_of=multiple, use_cpu=device.type == "cpu", disable_tqdm=True,
        # padding-free: TRL's collator concatenates a batch into one row with position ids restarting at each
        # sequence; the trainer adds the block-diagonal mask that keeps them apart (document_mask)
        padding_free=v.padding_free, use_liger_kernel=v.liger, activation_offloading=v.activation_offloading,
        # sync_free: the per-step NaN/Inf check of the loss (`torch.isnan(loss) or ...`: a host sync) off; a
        # non-finite loss then reaches the logged average instead of being replaced by it
        logging_nan_inf_filter=not v.sync_free,
        # sync_free with pinned loader memory: the batch's copies to the GPU non-blocking (accelerate's loader;
        # from pageable memory each copy waits for the stream: a host sync per tensor, five a step)
        accelerator_config={"non_blocking": v.sync_free and v.pin_memory},
        lr_scheduler_type="linear", warmup_steps=0, **trainer_compile_args(v),
        **info.get("trainer_args", {}))


class LeanTrainer:
    """What a variant without trainer metrics takes off the Trainer's host work each step, and ranks balanced: a
    mixin before SFTTrainer (`measured_trainer`), reading the variant and settings from `ftb_variant`,
    `ftb_settings`."""

    ftb_variant = ftb_settings = None
    params_counted = trained = balanced = None

    def floating_point_ops(self, inputs):
        """The Trainer's per-step FLOP count (its `total_flos`); without trainer metrics the model's parameter
        count is taken once: the Trainer walks every module and parameter for it each step, ~0.25 s of the
        host's Python a step on gpt-oss-120b's 9,216 expert layers (H100 profile, 2026-11-25)."""
        main = getattr(self.model, "main_input_name", "input_ids")
        if self.ftb_variant.trainer_metrics or main not in inputs or not hasattr(self.model, "num_parameters"):
            return super().floating_point_ops(inputs)
        if self.params_counted is None:
            self.params_counted = self.model.num_parameters(exclude_embeddings=True)
        return 6 * inputs[main].numel() * self.params_counted

    def _clip_grad_norm(self, model):
        """Gradient clipping; without trainer metrics over the trainable parameters listed once (the same
        norm: frozen parameters have no gradient) rather than `model.parameters()`, which the Trainer walks
        through every module each step. FSDP2 keeps the Trainer's own path (sharded gradients)."""
        if self.ftb_variant.trainer_metrics or self.ftb_variant.parallel == "fsdp2":
            return super()._clip_grad_norm(model)
        if self.trained is None:
            self.trained = [p for p in model.parameters() if p.requires_grad]
        return self.accelerator.clip_grad_norm_(self.trained, self.args.max_grad_norm)

    def _get_train_sampler(self, train_dataset=None):
        """balance_ranks: each step's packed rows dealt evenly to the ranks (ftbench.build.parallel.BalancedRanks)."""
        ds = self.train_dataset  # the packed rows, before the loader drops columns (same order, same length)
        v = self.ftb_variant
        if v.balance_ranks and self.args.world_size > 1 and "seq_lengths" in ds.column_names:
            self.balanced = parallel.BalancedRanks([packing.attention_cost(x) for x in ds["seq_lengths"]],
                                                   self.args.per_device_train_batch_size, self.args.world_size,
                                                   self.ftb_settings.seed)
            return self.balanced
        return super()._get_train_sampler(train_dataset)


def measured_trainer(v, s, device, pad_id, slots, curve):
    """SFTTrainer with the variant's loss path and inputs, remembering each micro-batch's tensors and loss
    (references only: no host sync) for the meter, and counting the label tokens of the held-out curve."""
    from transformers import Trainer
    from trl import SFTTrainer

    class MeasuredSFTTrainer(LeanTrainer, SFTTrainer):
        ftb_variant, ftb_settings = v, s
        pending: list = []

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            ranks = self.accelerator.num_processes if self.args.average_tokens_across_devices else 1
            if v.lm_head and not return_outputs and model.training:  # (evaluation: the paths below)
                return head_forward_loss(model, inputs, num_items_in_batch, ranks)
            if v.framework == "nemo":  # the model's own loss, through the forward NeMo's patches left (its record)
                return Trainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)
            if (fused_head_available() and not v.trainer_metrics and not return_outputs
                    and not getattr(self, "aux_loss_enabled", False)):  # (an MoE's router loss: TRL's path)
                return fused_head_loss(model, inputs, num_items_in_batch, ranks)
            if fused_head_available():
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            # TRL's fused LM head is a Triton kernel; without Triton (CPU-only machines) use the model's loss
            return Trainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)

        def _prepare_inputs(self, inputs):
            if v.attention == "varlen":  # (sync_free: the collator added them on the host already)
                # accelerate's loader has moved the batch to the device: reading the position ids syncs the host
                inputs = attention.row_kwargs(inputs, s.max_seq_length, pad_id, slots)
            inputs = super()._prepare_inputs(inputs)
            if (v.padding_free and v.attention == "mask" and v.framework != "unsloth"  # (Unsloth: its own packing)
                    and inputs.get("position_ids") is not None and inputs.get("attention_mask") is None):
                inputs = {**inputs, "attention_mask": document_mask(inputs["position_ids"])}
            return inputs

        def training_step(self, model, inputs, num_items_in_batch=None):
            if cuda_graphs(v) and device.type == "cuda":
                # CUDA graphs: a new training step begins here (their outputs from the last step may be reused)
                torch.compiler.cudagraph_mark_step_begin()
            loss = super().training_step(model, inputs, num_items_in_batch)
            if curve is not None:  # the label tokens trained on, for the held-out curve (on the device)
                curve.count(inputs["labels"])
            self.pending.append((inputs["input_ids"], inputs.get("attention_mask"), inputs.get("position_ids"), loss))
            return loss

    return MeasuredSFTTrainer


def step_reader(model, tokenizer, v, multiple, trainable: int):
    """What the meter reads of a step's micro-batches after the window's synchronisation: samples, real and padded
    tokens, FLOPs (HFU counts a full checkpoint's recomputed forward; selective checkpointing keeps the GEMMs) and
    the loss."""
    shape = causal_lm_shape(model.config.to_dict() if hasattr(model.config, "to_dict") else model.config)
    row_pad_id = tokenizer.pad_token_id if v.padding_free and multiple else None
    recompute = v.gradient_checkpointing and v.checkpoint_policy == "full"

    def step_fields(batches) -> dict:
        seqs = [batch_sequences(ids, mask, pos, row_pad_id) for ids, mask, pos, _ in batches]
        padded = [t for p, _ in seqs for t in p]
        real = [t for _, r in seqs for t in r]
        return {"samples": len(real), "tokens": sum(real), "padded_tokens": sum(padded),
                "loss": sum(b[-1].item() for b in batches) / len(batches),
                **step_flops(real, padded, shape, trainable, recompute)}
    return step_fields


def harness_callback(record, meter, curve, syncs, step_fields):
    """The callback that closes each optimizer step on the meter, takes the held-out curve's points, arms the sync
    watch at the first measured step and stops training once the last window has closed (its `trainer` set after
    the trainer is made)."""
    from transformers import TrainerCallback

    class HarnessCallback(TrainerCallback):
        trainer = None

        def on_train_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()
            meter.start()

        def on_step_end(self, args, state, control, **kw):
            if "time_to_first_step_s" not in record["extra"]:  # from this process's start: imports, build, step 1
                import psutil

                record["extra"]["time_to_first_step_s"] = time.time() - psutil.Process().create_time()
            batches, self.trainer.pending[:] = list(self.trainer.pending), []
            published_log = {"epoch": state.epoch, "elapsed_s": time.perf_counter() - self.t0,
                             "progress": state.global_step / state.max_steps}
            shapes = "+".join("x".join(map(str, b[0].shape)) for b in batches)
            if meter.step(None, lazy=lambda: step_fields(batches), shape=shapes, log_fields=published_log):
                control.should_training_stop = True
            if curve is not None and (control.should_training_stop or curve.due(state.global_step)):
                curve.evaluate(self.trainer, state.global_step)
            if meter.steps_taken >= meter.measure.warmup_steps:  # the measured steps from here (FTBENCH_SYNC_DEBUG)
                syncs.arm(meter.steps_taken)

    return HarnessCallback()


def bf16_tail_callback(model, share: float, record):
    """The callback of a bf16 tail (knob fp8_until): before the first optimizer step past `share` of them, every
    frozen FP8 projection switches to bf16 from its kept weight (ftbench.build.fp8.to_bf16); the record says at
    which step. The held-out points after it score the model as it then trains, on the bf16 base."""
    from transformers import TrainerCallback

    from ftbench.build.fp8 import to_bf16

    class BF16Tail(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            fp8_steps = round(share * state.max_steps)
            if "bf16_tail" not in record["extra"] and state.global_step >= fp8_steps:
                record["extra"]["bf16_tail"] = {"fp8_steps": fp8_steps, "steps": state.max_steps,
                                                "layers_switched": to_bf16(model)}

    return BF16Tail()


def prepare_trainer(trainer, model, ctx, record, pad_id, slots) -> None:
    """What the trainer needs before its first step: the LM head's two-GEMM loss, the host-side boundaries
    collator, the rows truncated and packed as the variant asks."""
    s, v = ctx.settings, ctx.variant
    if v.lm_head:  # the LM head's loss in two GEMMs a chunk (ftbench.build.head), wrapped around TRL's patched forward
        from ftbench.harness.meter import Unsupported

        try:
            record["extra"]["lm_head"] = head.add_head_loss(model.get_base_model(), v.lm_head)
        except ValueError as e:  # a head this scheme does not take (soft-capped or scaled logits, a trained head)
            raise Unsupported(str(e)) from e
    if v.sync_free and v.attention == "varlen":  # the boundaries from host tensors, in the loader
        trainer.data_collator = attention.HostBoundsCollator(trainer.data_collator, s.max_seq_length, pad_id, slots)
    if v.parallel == "fsdp2" and not trainer.is_fsdp_enabled:  # never train DDP under an FSDP2 name
        raise RuntimeError("parallel='fsdp2' but the trainer did not enable FSDP")
    if v.padding_free:  # the truncation TRL applies with max_length otherwise (the first tokens kept)
        trainer.train_dataset, trainer.eval_dataset = (truncate(ds, s.max_seq_length)
                                                       for ds in (trainer.train_dataset, trainer.eval_dataset))
    if v.token_budget:  # sequences packed whole into rows of the budget (ftbench.data.packing)
        trainer.train_dataset, trainer.eval_dataset = (packing.pack_rows(ds, v.token_budget, v.pack_order, s.seed)
                                                       for ds in (trainer.train_dataset, trainer.eval_dataset))
        if v.framework == "unsloth":  # the rows reach Unsloth's packed attention with their sequences' lengths
            record["extra"]["unsloth_rows"] = {"padding_free": trainer.args.padding_free, **packing.lengths_passed(
                trainer.data_collator, trainer.train_dataset, ctx.spec.batch_size)}


def trained_record(trainer, model, ctx, record, args, multiple, slots, n_train: int) -> None:
    """What ran, after training: the attention and loss paths, checkpointing, the peer's settings, the wrapper, the
    rows, the sync and copy settings the trainer ran with."""
    v = ctx.variant
    if v.framework == "unsloth":  # which flash kernels Unsloth ran its attention through (it may swap in FA3/FA4)
        record["extra"]["unsloth_flash_impl"] = unsloth_flash_impl()
    record["extra"]["gradient_checkpointing_active"] = bool(getattr(trainer.model, "is_gradient_checkpointing", False)
                                                            or getattr(model, "is_gradient_checkpointing", False))
    record["extra"]["peer"] = peer_record(v, record, args, ctx.spec.batch_size)
    if v.parallel:  # what the trainer wrapped the model in: DistributedDataParallel, or FSDP2's FSDP<class>
        record["extra"]["parallel_wrapper"] = type(trainer.model_wrapped).__name__
    record["extra"]["loss_path"] = (f"ftbench.build.head ({v.lm_head}: two GEMMs a chunk of tokens)" if v.lm_head else
                                    "the model's own (NeMo AutoModel's patched forward)" if v.framework == "nemo" else
                                    "model_cross_entropy" if not fused_head_available() else "trl_fused_lm_head" if
                                    v.trainer_metrics else "trl_fused_lm_head, without TRL's per-step metrics")
    record["extra"]["last_partial_batch_samples"] = n_train % ctx.spec.batch_size
    record["extra"]["pad_multiple"] = multiple
    if v.attention == "varlen":  # where each step's sequence boundaries came from (sync_free: no device read)
        record["extra"]["step_bounds"] = ("the loader's collator, host tensors"
                                          if isinstance(trainer.data_collator, attention.HostBoundsCollator)
                                          else "the step, from the batch on the device")
    record["extra"]["nan_inf_filter"] = args.logging_nan_inf_filter  # what the trainer ran with
    record["extra"]["non_blocking_copies"] = args.accelerator_config.non_blocking
    if v.token_budget:
        filled = [sum(n) for n in trainer.train_dataset["seq_lengths"]]  # each row's real tokens
        record["extra"]["packing"] = {"rows": len(trainer.train_dataset), "budget": v.token_budget,
                                      "strategy": "first fit in the run's seeded random order (sequences whole)"
                                      if v.pack_order == "shuffled" else
                                      "bfd (TRL's best fit decreasing; sequences whole)",
                                      "sequence_slots": slots, "row_tokens_mean": sum(filled) / max(len(filled), 1),
                                      "row_tokens_min": min(filled, default=0)}
    record["extra"]["train_samples"] = n_train
    if v.balance_ranks:  # the ranks' attention-cost spread with the balanced order and the plain one (None: not dealt)
        record["extra"]["balance_ranks"] = trainer.balanced.summary() if trainer.balanced is not None else None


def save_adapter(trainer, model, ctx, record) -> None:
    """The trained adapter: gathered from every rank (rank 0 writes it), NeMo's own, or PEFT's save."""
    v = ctx.variant
    if v.parallel:  # every rank joins the gather of the LoRA state; rank 0 writes it (the others have no adapter_dir)
        record["extra"]["adapter_save"] = parallel.save_adapter(trainer.model, ctx.adapter_dir)
    elif ctx.adapter_dir is not None and v.framework == "nemo":
        save_nemo_adapter(model, ctx.settings.lora, ctx.adapter_dir)
    elif ctx.adapter_dir is not None:
        trainer.model.save_pretrained(ctx.adapter_dir)
