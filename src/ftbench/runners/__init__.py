"""Runners, one per model family; ftbench.execute dispatches to them and owns the measurement."""
