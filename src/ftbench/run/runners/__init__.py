"""Runners, one per model family; ftbench.run.execute dispatches to them and owns the measurement."""
