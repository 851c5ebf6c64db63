"""A run: its configuration, data, round loop over an engine, checkpoints and run folder."""
