"""The config: its loading, checks and matrix, the techniques and their variants, the inputs a run names, the architectures."""
