"""The LM head's loss in two GEMMs a chunk of tokens, the second in the forward (knob lm_head), in bf16 or FP8.

TRL's fused LM head (the frontier's loss without TRL's metrics: ftbench.run.runners.causal_lm.fused_head_loss)
computes per-token log-probabilities in tiles and recomputes every tile in the backward: three GEMMs of tokens x
hidden x vocabulary a step (the forward's, the backward's recomputation, the input's gradient), in bf16. On
Qwen3-8B's 151,936-token vocabulary that is 8 % of a step's model FLOPs run three times in bf16 while the decoder's
run in FP8. With the head frozen (LoRA) and the loss known in the forward (the tokens' negative log-probabilities
summed, then scaled), the logits' gradient can be formed in the forward, as Liger Kernel's fused linear
cross-entropy does: per chunk of tokens the logits (GEMM 1), Liger's cross-entropy kernel turning them in place
into each token's loss and the logits' gradient, and the hidden states' gradient (GEMM 2), kept for the backward,
which only scales it. No boolean indexing of the tokens (TRL's `hidden_states[mask]` reads the device twice a step
mid-forward): every position goes through the head and an ignored label (-100) gives 0 loss and 0 gradient.

`lm_head: two-gemm` runs both GEMMs in bf16; `fp8` runs them in FP8: the head's weight cast to FP8 once (tensorwise
e4m3, with its transpose for GEMM 2, as fp8_recipe static casts the decoder's), a chunk's hidden states e4m3 with
their own tensorwise scale, and the logits' gradient e5m2 with a fixed scale: each entry is a probability minus 0
or 1, so it lies in [-1, 1] and 2^15 scales it into e5m2's range without an amax pass. The logits come out of GEMM
1 in bf16 and the kernel computes in fp32, as in Liger's bf16 path.

Where Triton cannot run (a CPU), the cross-entropy step is PyTorch's (log-softmax and softmax, the same formulas);
on a GPU Liger Kernel is needed (variants.check_supported).
"""

from __future__ import annotations

import functools

import torch

from ftbench.build.fp8 import E4M3, E5M2, fp8_gemm, frozen_fp8


def fused_head_available() -> bool:
    """Whether TRL's fused LM-head loss (a Triton kernel) can run here."""
    from trl.trainer import utils

    return utils._ChunkedLogProbFunction is not None


HEAD_KINDS = ("two-gemm", "fp8")
IGNORE = -100
CHUNK = 4096  # tokens a chunk: the logits of one chunk (bf16) are 1.2 GB on Qwen3's vocabulary
GRAD_SCALE = 2.0**15  # the logits' gradient lies in [-1, 1]; e5m2's largest value is 57,344


def cross_entropy_(logits: torch.Tensor, targets: torch.Tensor, loss: torch.Tensor, grad: bool) -> None:
    """Each row's cross-entropy against its target into `loss` (fp32; 0 where the target is IGNORE) and, with `grad`,
    the gradient of the rows' summed loss written over `logits` in place (softmax minus the target's one-hot; 0 rows
    where ignored). Liger Kernel's kernel on a GPU, PyTorch's ops elsewhere."""
    if logits.is_cuda:
        _liger_cross_entropy_(logits, targets, loss, grad)
        return
    x = logits.float()
    keep = targets != IGNORE
    t = targets.clamp(min=0)[:, None]
    lse = torch.logsumexp(x, dim=-1)
    loss.copy_((lse - x.gather(1, t).squeeze(1)) * keep)
    if grad:
        g = torch.softmax(x, dim=-1)
        g.scatter_add_(1, t, -torch.ones_like(t, dtype=g.dtype))
        logits.copy_(g * keep[:, None])


def _liger_cross_entropy_(logits, targets, loss, grad):
    """Liger Kernel's cross-entropy kernel as its fused linear cross-entropy calls it, with a summed loss (so it
    needs no count of the kept tokens, which Liger reads back to the host)."""
    import triton
    from liger_kernel.ops.cross_entropy import liger_cross_entropy_kernel
    from liger_kernel.ops.fused_linear_cross_entropy import MAX_FUSED_SIZE

    n, vocab = logits.shape
    liger_cross_entropy_kernel[(n,)](
        X_ptr=logits, X_stride=logits.stride(-2), Y_ptr=targets, Y_stride=targets.stride(-1), weight_ptr=None,
        loss_ptr=loss, z_loss_ptr=None, loss_stride=loss.stride(-1), token_accuracy_ptr=None, token_accuracy_stride=0,
        predicted_tokens_ptr=None, predicted_tokens_stride=0, n_cols=vocab, n_non_ignore=1, sum_non_ignore_weight=1,
        weight_sum=0.0, ignore_index=IGNORE, lse_square_scale=0.0, label_smoothing=0.0, reduction="sum", softcap=None,
        RETURN_Z_LOSS=False, RETURN_TOKEN_ACCURACY=False, RETURN_PREDICTED_TOKENS=False, HAS_WEIGHT=False,
        HAS_SOFTCAPPING=False, HAS_GRADIENTS=grad, BLOCK_SIZE=min(MAX_FUSED_SIZE, triton.next_power_of_2(vocab)),
        num_warps=32)


class HeadWeights:
    """The frozen head's weight as the GEMMs take it: bf16 as it is, or FP8 cast once with its transpose."""

    def __init__(self, weight: torch.Tensor, kind: str):
        if kind not in HEAD_KINDS:
            raise ValueError(f"lm_head {kind!r}: one of {HEAD_KINDS}")
        self.kind, self.weight = kind, weight
        if kind == "fp8":  # w8_t [hidden, vocab]: the weight column-major for GEMM 2
            self.w8, self.w_inv, self.w8_t = frozen_fp8(weight, transpose=True)
            self.grad_inv = torch.tensor(1 / GRAD_SCALE, device=weight.device)  # (made once: no copy a step)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """GEMM 1: h W^T, the chunk's logits in h's dtype (the caching allocator hands each chunk the last one's
        memory)."""
        if self.kind == "fp8":
            return fp8_gemm(h, E4M3, self.w8.t(), self.w_inv)
        return h @ self.weight.t()

    def input_grad(self, g: torch.Tensor) -> torch.Tensor:
        """GEMM 2: g W, the hidden states' gradient from the logits' gradient `g` (which it may overwrite)."""
        if self.kind == "fp8":
            g8 = g.mul_(GRAD_SCALE).to(E5M2)  # |g| <= 1: an exact power-of-two scaling, no amax pass
            return torch._scaled_mm(g8, self.w8_t.t(), scale_a=self.grad_inv, scale_b=self.w_inv, out_dtype=g.dtype)
        return g @ self.weight


class _HeadLoss(torch.autograd.Function):
    """The summed cross-entropy of the head's logits over `hidden`'s rows against `targets`; the hidden states'
    gradient is computed in the forward and scaled by the incoming gradient in the backward."""

    @staticmethod
    def forward(ctx, hidden, targets, weights: HeadWeights, chunk: int):
        grad = ctx.needs_input_grad[0]
        n = hidden.shape[0]
        loss = torch.zeros(n, dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if grad else None
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            logits = weights.logits(hidden[start:end])
            cross_entropy_(logits, targets[start:end], loss[start:end], grad)
            if grad:
                grad_hidden[start:end] = weights.input_grad(logits)
            del logits
        ctx.save_for_backward(grad_hidden)
        return loss.sum()

    @staticmethod
    def backward(ctx, grad_loss):
        (grad_hidden,) = ctx.saved_tensors
        return grad_hidden * grad_loss.to(grad_hidden.dtype), None, None, None


def head_loss(hidden: torch.Tensor, labels: torch.Tensor, weights: HeadWeights, num_items=None,
              chunk: int = CHUNK) -> torch.Tensor:
    """The causal LM loss of `hidden` ([..., T, H], the backbone's last hidden states) against `labels` ([..., T],
    unshifted, IGNORE where not trained): position t predicts label t + 1, the last position of each row none. The
    mean over the kept tokens, or the sum over `num_items` (the Trainer's count, over every rank's tokens)."""
    targets = torch.nn.functional.pad(labels[..., 1:], (0, 1), value=IGNORE).reshape(-1)
    flat = hidden.reshape(-1, hidden.shape[-1])
    total = _HeadLoss.apply(flat, targets.contiguous(), weights, chunk)
    count = (targets != IGNORE).sum() if num_items is None else num_items
    return total / torch.as_tensor(count).clamp(min=1)


def add_head_loss(causal_lm, kind: str) -> dict:
    """Give `causal_lm` (the transformers model, under PEFT's wrappers) a forward that, called with
    `head_loss=True`, runs its backbone and returns this module's loss in `.loss` (and no logits); without it the
    forward is the one it had. The head's weight must be frozen (its gradient is not computed)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    text = causal_lm.config.get_text_config()
    if getattr(text, "final_logit_softcapping", None) is not None or getattr(text, "logit_scale", None) not in (None,
                                                                                                               1.0):
        raise ValueError("lm_head: a model whose logits are soft-capped or scaled is not wired")
    head = causal_lm.get_output_embeddings()
    if head.weight.requires_grad or getattr(head, "bias", None) is not None:
        raise ValueError("lm_head: the head must be frozen and without a bias (its weight's gradient is not computed)")
    weights = HeadWeights(head.weight, kind)
    inner = causal_lm.forward

    @functools.wraps(type(causal_lm).forward)
    def forward(*args, head_loss_on=False, labels=None, num_items_in_batch=None, **kwargs):
        if not head_loss_on:
            if labels is not None:
                kwargs["labels"] = labels
            if num_items_in_batch is not None:
                kwargs["num_items_in_batch"] = num_items_in_batch
            return inner(*args, **kwargs)
        kwargs["use_cache"] = False
        out = causal_lm.base_model(*args, **kwargs)
        return CausalLMOutputWithPast(loss=head_loss(out.last_hidden_state, labels, weights, num_items_in_batch))

    causal_lm.forward = forward
    return {"kind": kind, "chunk_tokens": CHUNK, "gemms_a_chunk": 2,
            "weight_fp8_gib": 2 * head.weight.numel() / 2**30 if kind == "fp8" else 0.0,
            "cross_entropy": "Liger Kernel's kernel (CUDA) or PyTorch's ops", "grad_scale": GRAD_SCALE
            if kind == "fp8" else None}
