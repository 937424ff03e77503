"""The adapters as they will be served: a technique that trains on another base than bf16 (FP8 GEMMs, an NF4 base)
is also scored with its trained adapters on the bf16 base (ftbench.data.heldout.ServedTwin), built here with the same
structure (the adapters' names, the rows and attention the held-out split is fed through)."""

from __future__ import annotations

from ftbench.build import attention, head, route
from ftbench.data import heldout

# what a technique's adapters are served with: the model's structure (the adapters' names, the rows and attention the
# held-out split is fed through); every other knob (the base's precision, compilation, the head's loss, the kernels
# of the training step) back to its default: the bf16 base
SERVED_KEEP = ("peft", "fused_projections", "fused_adapters", "attention", "flash_impl", "padding_free",
               "token_budget", "sdpa_backend", "experts", "expert_lora")


# what TRL's SFTTrainer (1.15) computes in the fused LM head it adds to the model it trains
TRL_FUSED_OUTPUTS = ("log_probs", "entropy", "is_top1")


def served_variant(v):
    """The variant a technique's adapters are served on: its structure on the bf16 base (SERVED_KEEP)."""
    from ftbench.core.knobs import Variant

    return Variant(name=f"{v.name} (served on the bf16 base)", **{k: getattr(v, k) for k in SERVED_KEEP})


def served_twin(ctx, device, model):
    """A `heldout.ServedTwin` where the technique trains on a base other than bf16 (FP8, NF4) through PEFT on one
    device, else None (its trained path is its served path)."""
    v = ctx.variant
    if v.precision not in ("fp8", "nf4") or v.framework != "hf" or v.parallel or v.peft != "lora":
        return None

    def build():
        twin, _ = route.build_causal_lm(ctx.manifest, ctx.settings.seed, device, served_variant(v),
                                           ctx.settings.lora)
        twin.config.use_cache = False
        if v.attention == "varlen":
            attention.use_varlen(twin)
        if head.fused_head_available():  # the loss path the trainer scores with (TRL's fused head)
            from trl.trainer.utils import add_fused_lm_head

            # the fields SFTTrainer asks of its own head: its compute_loss reads the entropy and top-1 of every call
            # (a twin with the default log-probabilities alone failed each QLoRA run, whose trainer keeps its
            # metrics: 'NoneType' object has no attribute 'detach', H200, 2026-12-07)
            add_fused_lm_head(twin.get_base_model(), outputs=TRL_FUSED_OUTPUTS)
        return twin.eval()
    return heldout.ServedTwin(build)
