"""The held-out loss during a fine-tune, at the tokens trained so far: the quality study's curve (ftbench.judge.quality).

Every technique is scored the same way: the token-weighted mean next-token loss over the whole held-out split, from
the model as it trains (its own forward, its own precision), in evaluation mode without gradients; and, where the
technique changes the frozen base's numbers (an FP8 or NF4 base), also as it will be served: the trained adapters
copied onto the bf16 base (`served`), through the same loader and loss. Only the text a fine-tune is meant to learn
is scored (`scored_split`): an instruction's answer and the end of its turn, never the prompt or the chat template;
a plain text's own words (its body and its title), never the template around them. Token-weighted,
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


def held_out_loss(trainer, model=None) -> tuple[float, int]:
    """(token-weighted mean loss over the held-out split, its label tokens), through the trainer's own evaluation
    loader, input preparation and loss (so each technique's attention path and loss kernel score it); `model`: another
    model through the same (the adapters on the bf16 base), else the trainer's."""
    model = trainer.model if model is None else model
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
    tokens trained so far (counted on the device each step; read only when the curve is evaluated); `last`: (k,
    steps): also after each of the last k of the run's `steps`. `served`: a callable giving the bf16 base with the
    trained adapters copied in (`ServedTwin`), scored beside at each point."""

    def __init__(self, every: int, served=None, scored: str = "every token", last: tuple[int, int] = (0, 0)):
        self.every, self.served, self.scored, self.last = every, served, scored, last
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
        point = {"step": step, "tokens": tokens, "loss": loss}
        if self.served is not None:
            point["served"] = held_out_loss(trainer, self.served(trainer.model))[0]
        self.points.append(point)

    def due(self, step: int) -> bool:
        return step % self.every == 0 or (self.last[0] > 0 and step > self.last[1] - self.last[0])

    def summary(self) -> dict:
        return {"points": self.points, "every_steps": self.every, "last_steps": self.last[0],
                "eval_label_tokens": self.eval_tokens,
                "scored": self.scored,
                "served": ("each point's `served`: the trained adapters on the bf16 base, the same split and loss"
                           if self.served is not None else None),
                "how": "token-weighted mean next-token loss over the whole held-out split, the model's own forward "
                       "in evaluation mode; tokens: label tokens trained on before it"}


SCORED = {"instruction": "the answer (completion) tokens and the end of its turn: not the prompt, not the chat "
                         "template",
          "wikipedia": "the text's own tokens (its body and title): not the chat template around them"}


def scored_spans(text: str, messages: list[dict], kind: str) -> list[tuple[int, int]]:
    """The character spans of a rendered chat `text` that are scored: an instruction's answer from its first
    character to the end of the text (the end of its turn, as TRL's completion mask takes it); a plain text's every
    message's content (its body and title), each where it appears in order."""
    spans, at = [], 0
    for m in messages:
        start = text.find(m["content"], at)
        if start < 0:
            raise ValueError(f"a message's content is not in its rendered chat ({m['role']})")
        at = start + len(m["content"])
        if kind == "wikipedia" or m["role"] == "assistant":
            spans.append((start, len(text) if kind == "instruction" else at))
    return spans


def scored_labels(tokenizer, messages: list[dict], kind: str) -> dict:
    """One held-out chat tokenized as the trainer tokenizes it (its chat template rendered, then tokenized without
    special tokens added) with labels: each token's id where it lies in a scored span (`scored_spans`), else -100."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = scored_spans(text, messages, kind)
    labels = [t if any(a <= s < b for a, b in spans) else -100
              for t, (s, e) in zip(enc["input_ids"], enc["offset_mapping"])]
    return {"input_ids": enc["input_ids"], "labels": labels}


def scored_split(ds, tokenizer, kind: str):
    """The held-out split of chats (a `messages` column) tokenized with scored labels (`scored_labels`)."""
    return ds.map(lambda ex: scored_labels(tokenizer, ex["messages"], kind), remove_columns=ds.column_names)


class ServedTwin:
    """The bf16 base a technique's adapters are served on: built once (`build`: () -> the model with adapters of the
    same names), and at each call the trained model's adapter weights copied in, by name (compiled layers' wrappers
    left out of the names). A trained adapter the twin lacks is an error, never a silent partial copy."""

    def __init__(self, build):
        self.build, self.model, self.pairs = build, None, None

    @staticmethod
    def _names(model) -> dict:
        return {n.replace("._orig_mod", "").replace("_orig_mod.", ""): p for n, p in model.named_parameters()}

    def __call__(self, trained):
        if self.model is None:
            self.model = self.build()
            mine, theirs = self._names(self.model), self._names(trained)
            wanted = {n: p for n, p in theirs.items() if p.requires_grad}
            missing = sorted(set(wanted) - set(mine))
            if missing or not wanted:
                raise RuntimeError(f"the bf16 twin lacks {len(missing)} of the {len(wanted)} trained adapter tensors "
                                   f"(first: {missing[:2]})")
            self.pairs = [(mine[n], p) for n, p in wanted.items()]
        with torch.no_grad():
            for dst, src in self.pairs:
                dst.copy_(src.detach().to(dst.dtype))
        return self.model
