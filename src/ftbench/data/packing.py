"""Rows of a token budget (variant knob `token_budget`, causal LM, padding-free): every step has one shape.

A padding-free batch is one row whose length is whatever its sequences add up to, so each step has a new shape
(nothing can be captured in a CUDA graph, and compiled code sees a new size every step). Here the tokenized
sequences, each already truncated to `max_seq_length`, are packed whole into rows of at most `budget` tokens by
TRL's best-fit-decreasing packer (`trl.data_utils.pack_dataset`, strategy "bfd"): a sequence that would straddle
a row is never split; it goes to the row with the least room that still holds it, or starts a new one. A batch of
B rows is then one row of B x budget tokens: the collator pads its tail with pad tokens (position 0, no labels),
which are computed but not counted as samples or real tokens (ftbench.run.runners.causal_lm.batch_sequences), and
variable-length attention passes a fixed number of sequence slots (ftbench.build.attention.sequence_bounds).
Packing reorders the sequences (longest first within the packer's bins), so a packed rung's first steps hold other
samples than rung 0's; its loss is compared on the evaluation set, which every rung sees whole. Best fit decreasing
groups like lengths (on the quality study's plain text: rows of the longest sequences alone, rows of the shortest,
and a short last row of a few) and packs the same rows under every seed, whose shuffle then only reorders them. Knob
`pack_order: shuffled` deals the sequences in the run's seeded random order, each whole into the first row with room
(`first_fit`), filled evenly where that costs no row: rows that mix lengths as a padded batch does, other rows under
each seed, and no short last row where the rows have room to share.
Unsloth (framework unsloth) trains the same rows unpadded through its own packed attention: its SFTTrainer wraps the
padding-free collator to pass each sequence's length from the rows' `seq_lengths` (`lengths_passed` checks it did).
"""

from __future__ import annotations

MIN_SEQUENCE = 64  # slots per row: room for sequences this short on average before a row needs more slots


def pack_rows(ds, budget: int, order: str | None = None, seed: int = 0):
    """The dataset packed into rows of at most `budget` tokens, sequences whole (`seq_lengths` per row): by TRL's
    best fit decreasing, or (`order` "shuffled") first fit in a random order drawn from `seed`; only its per-token
    columns travel (input_ids, labels, masks: lists of scalars), not the chat messages they came from."""
    import datasets
    from trl.data_utils import pack_dataset

    per_token = [c for c, f in ds.features.items()
                 if isinstance(f, (datasets.List, datasets.Sequence)) and isinstance(f.feature, datasets.Value)]
    ds = ds.select_columns(per_token)
    longest = max((len(x) for x in ds["input_ids"]), default=0)
    if longest > budget:
        raise ValueError(f"token_budget {budget} is shorter than a sequence ({longest} tokens): sequences are packed "
                         "whole, so the budget must hold the longest (training.max_seq_length truncates them)")
    if order != "shuffled":
        return pack_dataset(ds, budget, strategy="bfd")
    columns = {c: ds[c] for c in ds.column_names}  # each column read once
    lengths = [len(x) for x in columns["input_ids"]]
    rows = first_fit(lengths, budget, seed)
    packed = {c: [[t for i in row for t in values[i]] for row in rows] for c, values in columns.items()}
    packed["seq_lengths"] = [[lengths[i] for i in row] for row in rows]
    return datasets.Dataset.from_dict(packed)


def first_fit(lengths: list[int], budget: int, seed: int) -> list[list[int]]:
    """The sequences' indices a row: dealt in a random order drawn from `seed`, each whole into the first row with
    room for it. Filled evenly where that costs no row more than first fit to the budget needs, so that no step
    trains on a short last row of a few sequences: over as few rows as the budget allows (or one more, where first
    fit needs it too), first up to an even share of the tokens, then what did not fit up to the budget. Else (many
    rows, each nearly full) each row as full as first fit makes it, the last one short. Empty sequences are left
    out (as TRL's packer leaves them)."""
    import random

    order = [i for i in range(len(lengths)) if lengths[i] > 0]
    random.Random(seed).shuffle(order)
    total = sum(lengths[i] for i in order)
    n = -(-total // budget)
    rows = deal(order, lengths, n, -(-total // max(n, 1)), budget)
    if len(rows) <= n:
        return rows
    full = deal(order, lengths, len(order), budget, budget)
    more = deal(order, lengths, n + 1, -(-total // (n + 1)), budget)
    return more if len(more) <= len(full) else full


def deal(order: list[int], lengths: list[int], n: int, even: int, budget: int) -> list[list[int]]:
    """`first_fit`'s one pass: up to `n` rows filled first fit to `even` tokens, then the rest first fit to `budget`
    (a new row where none has room)."""
    smallest = min((lengths[i] for i in order), default=0)
    rows, used = [], []

    def place(i: int, room: int, open_rows: list, may_open: bool) -> bool:
        j = next((j for j in open_rows if used[j] + lengths[i] <= room), None)
        if j is None and not may_open:
            return False
        if j is None:
            rows.append([])
            used.append(0)
            j = len(rows) - 1
            open_rows.append(j)
        rows[j].append(i)
        used[j] += lengths[i]
        if used[j] + smallest > room:  # full: no sequence fits it any more
            open_rows.remove(j)
        return True

    first = []  # the rows with room left within the even share, oldest first
    left = [i for i in order if not place(i, even, first, len(rows) < n)]
    spare = [j for j in range(len(rows)) if used[j] + smallest <= budget]
    for i in left:
        place(i, budget, spare, True)
    return rows


def attention_cost(seq_lengths) -> int:
    """A packed row's attention work, up to a constant: each sequence attends within itself (causal, variable
    length), so its cost grows with its length squared. Rows of one budget differ in this alone (their GEMMs see
    the same number of tokens)."""
    return sum(int(n) ** 2 for n in seq_lengths)


def row_tokens(batch_size: int, budget: int) -> int:
    """The tokens of every step's row: B rows of `budget` tokens."""
    return batch_size * budget


def bound_slots(batch_size: int, budget: int, max_length: int) -> int:
    """The sequence slots of a step's row: its real sequences (MIN_SEQUENCE tokens each on average, or fewer
    slots than that where rows are short) plus its padding, in pieces of at most `max_length` tokens."""
    tokens = row_tokens(batch_size, budget)
    return tokens // MIN_SEQUENCE + -(-tokens // max_length) + 1


def lengths_passed(collator, rows, batch_size: int) -> dict:
    """The sequence lengths a collator passes on for the first batch of packed rows (`packed_seq_lengths`: what
    Unsloth's padding-free collator adds, and its attention keeps the sequences of a row apart by), checked against
    the rows' own (`seq_lengths`). Raises where it passes none or others: the attention would run across the
    sequences of a row, or the trainer turned padding-free off and pads rows it does not know are packed."""
    batch = [rows[i] for i in range(min(batch_size, len(rows)))]
    passed = collator(batch).get("packed_seq_lengths")
    want = [int(n) for row in batch for n in row["seq_lengths"]]
    if passed is None:
        raise RuntimeError("the collator passes no sequence lengths (packed_seq_lengths) with the packed rows: "
                           "Unsloth did not take them as padding-free rows")
    if [int(n) for n in passed] != want:
        raise RuntimeError(f"the collator passes sequence lengths {[int(n) for n in passed][:8]}... for rows of "
                           f"{want[:8]}...")
    return {"rows": len(batch), "sequences": len(want), "tokens": sum(want)}
