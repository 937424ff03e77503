"""What a run measures: the meter and its record, the summary, the code's and GPU's provenance, ranks, FLOPs, kernel names."""
