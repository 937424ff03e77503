"""The held-out loss during a fine-tune, at the tokens trained so far: the quality study's curve (ftbench.quality).

Every technique is scored the same way: the token-weighted mean next-token loss over the whole held-out split, from
the model as it trains (its own forward, its own precision), in evaluation mode without gradients. Token-weighted,
not the mean of per-batch means, so a technique that batches the held-out rows differently (packed rows, padded
batches) is scored on the same tokens with the same weights: each batch's mean loss times its label tokens (labels
other than -100 after the shift; a padding-free row's first token of each sequence carries -100, as a padded
batch's first token has no target), summed, over all label tokens.
"""

from __future__ import annotations

import torch


def label_tokens(labels) -> torch.Tensor:
    """The tokens a batch's loss is taken over (a device tensor: no host sync)."""
    return (labels[..., 1:] != -100).sum()


def held_out_loss(trainer) -> tuple[float, int]:
    """(token-weighted mean loss over the held-out split, its label tokens), through the trainer's own evaluation
    loader, input preparation and loss (so each technique's attention path and loss kernel score it)."""
    model = trainer.model
    training = model.training
    model.eval()
    total, count = None, None
    try:  # compiled layers run eagerly here (the same modules, FP8 ones too): no evaluation graphs to compile, and
        # no CUDA graphs whose outputs the training step's would overwrite
        with torch.no_grad(), torch.compiler.set_stance("force_eager"):
            for inputs in trainer.get_eval_dataloader():
                inputs = trainer._prepare_inputs(inputs)
                n = label_tokens(inputs["labels"])
                loss = trainer.compute_loss(model, inputs).detach().double() * n
                total = loss if total is None else total + loss
                count = n if count is None else count + n
    finally:
        model.train(training)
    count = int(count.item()) if count is not None else 0
    return (float(total.item()) / count if count else float("nan")), count


class HeldOutCurve:
    """The held-out loss before the first step, every `every` optimizer steps and after the last, each at the label
    tokens trained so far (counted on the device each step; read only when the curve is evaluated)."""

    def __init__(self, every: int):
        self.every = every
        self.points: list[dict] = []
        self.trained = None  # label tokens trained on so far (a device tensor)
        self.eval_tokens = None

    def count(self, labels) -> None:
        n = label_tokens(labels)
        self.trained = n if self.trained is None else self.trained + n

    def evaluate(self, trainer, step: int) -> None:
        if self.points and self.points[-1]["step"] == step:
            return
        loss, self.eval_tokens = held_out_loss(trainer)
        tokens = int(self.trained.item()) if self.trained is not None else 0
        self.points.append({"step": step, "tokens": tokens, "loss": loss})

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def summary(self) -> dict:
        return {"points": self.points, "every_steps": self.every, "eval_label_tokens": self.eval_tokens,
                "how": "token-weighted mean next-token loss over the whole held-out split, the model's own forward "
                       "in evaluation mode; tokens: label tokens trained on before it"}
