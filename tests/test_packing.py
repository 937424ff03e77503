"""Rows of a token budget (ftbench.data.packing, variant knob token_budget): sequences packed whole, one shape per step,
real tokens counted without the padding, a fixed number of sequence slots for variable-length attention."""

from __future__ import annotations

import pytest
import torch

from ftbench.build import attention
from ftbench.data import packing
from ftbench.run.runners.causal_lm import batch_sequences

PAD = 0


def _tokenized(lengths, seed=0):
    from datasets import Dataset

    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(5, 4000, (n,), generator=g).tolist() for n in lengths]
    return Dataset.from_dict({"input_ids": ids, "labels": ids,  # and the chat a tokenized SFT dataset keeps
                              "messages": [[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
                                           for _ in lengths]})


def test_sequences_are_packed_whole_into_rows_of_the_budget():
    lengths = [700, 1200, 90, 2048, 333, 1500, 12, 2048, 640, 800, 1024, 77]
    ds = _tokenized(lengths)
    rows = packing.pack_rows(ds, 4096)
    assert all(sum(r) == len(ids) <= 4096 for r, ids in zip(rows["seq_lengths"], rows["input_ids"]))
    assert sorted(n for r in rows["seq_lengths"] for n in r) == sorted(lengths)  # none split, none lost
    originals = {tuple(x) for x in ds["input_ids"]}
    for r, ids in zip(rows["seq_lengths"], rows["input_ids"]):  # each sequence's tokens are one original sequence
        edges = [0, *torch.tensor(r).cumsum(0).tolist()]
        assert all(tuple(ids[a:b]) in originals for a, b in zip(edges, edges[1:]))
    assert len(rows) <= -(-sum(lengths) // 4096) + 1  # best fit decreasing wastes less than a row here
    with pytest.raises(ValueError, match="shorter than a sequence"):
        packing.pack_rows(ds, 1024)


def test_mixed_rows_deal_the_sequences_in_the_seeds_order_each_row_a_mix_of_lengths():
    """pack_order shuffled: every sequence whole in exactly one row of at most the budget, as few rows as the budget
    allows, filled evenly (no short last row); one seed packs the same rows twice, another seed other rows; where best
    fit decreasing groups like lengths (rows of sixteen 256-token sequences, rows of short ones, a short last row),
    the mixed rows each hold long and short ones, as a padded batch drawn at random does."""
    lengths = [256] * 64 + [200] * 40 + [120] * 60 + [60] * 20  # the plain text's shape: long ones cut at 256
    ds = _tokenized(lengths)
    bfd = packing.pack_rows(ds, 4096)
    mixed = packing.pack_rows(ds, 4096, "shuffled", seed=1)
    assert all(sum(r) == len(ids) <= 4096 for r, ids in zip(mixed["seq_lengths"], mixed["input_ids"]))
    assert sorted(n for r in mixed["seq_lengths"] for n in r) == sorted(lengths)  # none split, none lost
    originals = {tuple(x) for x in ds["input_ids"]}
    for r, ids in zip(mixed["seq_lengths"], mixed["input_ids"]):  # labels travel with their tokens
        edges = [0, *torch.tensor(r).cumsum(0).tolist()]
        assert all(tuple(ids[a:b]) in originals for a, b in zip(edges, edges[1:]))
    assert mixed["labels"] == mixed["input_ids"] and "messages" not in mixed.column_names
    assert len(mixed) == len(bfd) == -(-sum(lengths) // 4096)  # as few rows as the budget allows
    assert sum(set(r) == {256} for r in bfd["seq_lengths"]) >= 3  # best fit decreasing: rows of the longest alone
    assert min(sum(r) for r in bfd["seq_lengths"]) < 0.7 * 4096  # ... and a short last row
    assert all(256 in r and min(r) <= 120 for r in mixed["seq_lengths"])  # each mixed row: long and short ones
    assert min(sum(r) for r in mixed["seq_lengths"]) >= 0.9 * sum(lengths) / len(mixed)  # filled evenly
    assert packing.pack_rows(ds, 4096, "shuffled", seed=1)["seq_lengths"] == mixed["seq_lengths"]
    assert packing.pack_rows(ds, 4096, "shuffled", seed=2)["seq_lengths"] != mixed["seq_lengths"]
    assert packing.first_fit([5, 0, 3], 8, seed=0) in ([[0, 2]], [[2, 0]])  # an empty sequence is left out
    for seed in range(20):  # dense rows (the speed runs' text): never a row more than first fit needs
        draw = torch.Generator().manual_seed(seed)
        dense = torch.randint(20, 513, (int(torch.randint(50, 400, (1,), generator=draw)),), generator=draw).tolist()
        rows = packing.first_fit(dense, 4096, seed)
        assert sorted(i for r in rows for i in r) == list(range(len(dense)))
        assert all(sum(dense[i] for i in r) <= 4096 for r in rows)
        assert len(rows) <= sum(dense) / (4096 - 512) + 1  # every row but one fuller than the budget less a sequence


def test_pack_order_needs_a_token_budget():
    from ftbench.core.knobs import Variant, model_problems

    assert any("pack_order without token_budget" in p
               for p in model_problems(Variant(name="v", padding_free=True, pack_order="shuffled")))
    assert not any("pack_order" in p for p in model_problems(
        Variant(name="v", padding_free=True, token_budget=4096, pack_order="shuffled")))


def test_every_step_has_one_shape_and_counts_only_real_tokens():
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    rows = packing.pack_rows(_tokenized([1500, 900, 2000, 300, 1800, 700, 64, 1000]), 2048)
    collate = DataCollatorForLanguageModeling(pad_token_id=PAD, padding_free=True,
                                              pad_to_multiple_of=packing.row_tokens(2, 2048))
    for i in range(0, len(rows) - 1, 2):
        pair = [rows[i], rows[i + 1]]
        batch = collate(pair)
        assert batch["input_ids"].shape == (1, 4096)
        computed, real = batch_sequences(batch["input_ids"], None, batch["position_ids"], PAD)
        assert real == [n for r in pair for n in r["seq_lengths"]]  # the sequences, not the padding
        assert sum(computed) == 4096 and (batch["labels"][0, sum(real):] == -100).all()


def test_host_bounds_collator_adds_the_step_kwargs_the_step_would_compute():
    """sync_free: the collator computes the boundaries from the batch's host tensors, the same tensors the step
    computes from the batch on the device otherwise (and the step then leaves them as they are)."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    rows = packing.pack_rows(_tokenized([1500, 900, 2000, 300, 1800, 700, 64, 1000]), 2048)
    collate = DataCollatorForLanguageModeling(pad_token_id=PAD, padding_free=True,
                                              pad_to_multiple_of=packing.row_tokens(2, 2048))
    slots = packing.bound_slots(2, 2048, 2048)
    host = attention.HostBoundsCollator(collate, 2048, PAD, slots)
    for i in range(0, len(rows) - 1, 2):
        pair = [rows[i], rows[i + 1]]
        got, plain = host(pair), collate(pair)
        want = attention.row_kwargs(plain, 2048, PAD, slots)
        assert set(got) == set(want) and got["max_length_q"] == got["max_length_k"] == 2048
        for key in ("input_ids", "position_ids", "labels", "cu_seq_lens_q", "cu_seq_lens_k"):
            assert torch.equal(got[key], want[key]), key
        assert got["cu_seq_lens_q"].shape == (slots + 1,) and got["cu_seq_lens_q"].device.type == "cpu"
        assert attention.row_kwargs(got, 2048, PAD, slots) is got  # the step adds nothing more


def test_fixed_slots_give_one_bounds_shape_and_the_same_attention():
    """Bounds padded to a fixed number of slots (empty sequences) and the padding split into pieces of at most
    max_length: the real tokens' attention output is unchanged, and the shape is the same for every row."""
    g = torch.Generator().manual_seed(0)
    shapes = set()
    for lengths in ([5, 9, 3], [17], [2, 2, 2, 2, 2, 2]):
        n, pads = 40, 40 - sum(lengths)
        pos = torch.cat([*(torch.arange(k) for k in lengths), torch.zeros(pads, dtype=torch.long)])[None]
        ids = torch.cat([torch.randint(5, 50, (sum(lengths),), generator=g), torch.full((pads,), PAD)])
        assert attention.trailing_pads(ids, pos[0], PAD) == pads
        fixed = attention.step_kwargs(pos, 20, pads, slots=12)
        b = fixed["cu_seq_lens_q"]
        shapes.add(tuple(b.shape))
        assert b[0] == 0 and b[-1] == n and (b.diff() >= 0).all() and (b.diff() <= 20).all()
        q, k, v = (torch.randn(1, 2, n, 4, generator=g) for _ in range(3))
        got, _ = attention.varlen_attention(None, q, k, v, None, **fixed)
        want, _ = attention.varlen_attention(None, q, k, v, None, **attention.step_kwargs(pos, 64))
        real = sum(lengths)
        torch.testing.assert_close(got[:, :real], want[:, :real])
    assert shapes == {(13,)}
    many = torch.zeros(1, 30, dtype=torch.long)  # 30 one-token sequences: more than 12 slots, the next multiple
    assert attention.sequence_bounds(many, 0, 8, slots=12).shape == (37,)


def test_token_budget_needs_padding_free():
    from ftbench.config.settings import Variant
    from ftbench.core.knobs import knob_problems

    assert knob_problems("causal_lm", Variant("x", padding_free=True, attention="varlen", token_budget=4096)) == []
    assert "without padding_free" in knob_problems("causal_lm", Variant("x", token_budget=4096))[0]
    assert "fused_projections" in knob_problems("causal_lm", Variant("x", precision="nf4", fused_projections=True))[0]


def test_unsloth_trains_the_rows_of_a_token_budget_unpadded_through_its_own_loop():
    """framework unsloth takes the frontier's rows (padding-free, a token budget): no row padding (its packed
    attention takes the rows' sequence lengths; a padded tail would be a sequence it is not told of), and not the
    knobs wired for PEFT's loop (TRL's fused head without metrics, host-side boundaries)."""
    from ftbench.config.settings import TrainSettings, Variant
    from ftbench.core.knobs import knob_problems
    from ftbench.run.runners.causal_lm import pad_multiple

    rows = dict(framework="unsloth", padding_free=True, token_budget=4096)
    assert knob_problems("causal_lm", Variant("x", **rows)) == []
    assert knob_problems("causal_lm", Variant("x", precision="nf4", **rows)) == []
    assert "framework='unsloth'" in knob_problems("causal_lm", Variant("x", trainer_metrics=False, **rows))[0]
    assert "framework='unsloth'" in knob_problems("causal_lm", Variant("x", sync_free=True, **rows))[0]
    settings = TrainSettings()
    assert pad_multiple(Variant("x", **rows), settings, 2) is None
    assert pad_multiple(Variant("x", padding_free=True, attention="varlen", token_budget=4096), settings, 2) == 8192


def test_the_rows_reach_unsloth_only_with_each_sequences_length():
    """packing.lengths_passed: the collator must pass the packed rows' sequence lengths (what Unsloth's padding-free
    collator adds, packed_seq_lengths); TRL's collator alone passes none, a wrong one other lengths: both raise."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from ftbench.data.packing import lengths_passed, pack_rows

    rows = pack_rows(_tokenized([30, 20, 12, 9, 5]), 32)
    trl = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    with pytest.raises(RuntimeError, match="no sequence lengths"):
        lengths_passed(trl, rows, 2)

    def unsloth_like(examples, shift=0):
        batch = trl(examples)
        batch["packed_seq_lengths"] = torch.tensor([n + shift for e in examples for n in e["seq_lengths"]])
        return batch

    got = lengths_passed(unsloth_like, rows, 2)
    want = [n for r in [rows[0], rows[1]] for n in r["seq_lengths"]]
    assert got == {"rows": 2, "sequences": len(want), "tokens": sum(want)} and sum(want) <= 64
    with pytest.raises(RuntimeError, match="passes sequence lengths"):
        lengths_passed(lambda e: unsloth_like(e, shift=1), rows, 2)


def test_the_padded_and_packed_rows_of_one_batch_hold_the_same_real_tokens():
    """Study B's batch shape (padded batches, as the study's SFTTrainer made them) and ours packed (one row, no
    padding): the same sequences, the same real tokens and labels; only the padding differs, and the record counts
    it (real against computed tokens)."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from ftbench.run.runners.causal_lm import batch_sequences

    examples = [{"input_ids": list(range(5, 5 + n)), "completion_mask": [0] * (n // 2) + [1] * (n - n // 2)}
                for n in (7, 30, 12, 3)]
    padded = DataCollatorForLanguageModeling(pad_token_id=0)(examples)
    packed = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(examples)
    assert padded["input_ids"].shape == (4, 30) and packed["input_ids"].shape == (1, 52)
    computed, real = batch_sequences(padded["input_ids"], padded["attention_mask"], None)
    p_computed, p_real = batch_sequences(packed["input_ids"], None, packed["position_ids"])
    assert real == p_real == [7, 30, 12, 3] and sum(p_computed) == 52 and sum(computed) == 120
    # the tokens the loss predicts (labels shift by one inside the model: a sequence's first token is never a
    # target; packed, the collator masks it so no sequence predicts across into the next): the same 48
    assert (padded["labels"][:, 1:] != -100).sum() == (packed["labels"][:, 1:] != -100).sum() == 52 - 4
    real_ids = [t for row, mask in zip(padded["input_ids"], padded["attention_mask"]) for t, m in zip(row, mask) if m]
    assert [int(t) for t in real_ids] == packed["input_ids"][0].tolist()
