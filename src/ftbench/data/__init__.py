"""The data: datasets, token statistics, packing, the held-out split and its scoring, the tokenizer."""
