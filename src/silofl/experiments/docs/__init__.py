"""Generators of the result documents under ``docs/`` (each document names the command that made it)."""
