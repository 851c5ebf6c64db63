"""A forked worker's target for tests/core/test_forking.py: what the worker was called with, and whether it
imported the command line."""

import json
import sys


def record(path: str, run: dict, engine: dict) -> None:
    """Write the arguments the worker got, its argv and whether ``silofl.cli`` is loaded, to ``path``."""
    with open(path, "w") as f:
        json.dump(
            {"run": run, "engine": engine, "argv": sys.argv, "cli": "silofl.cli.main" in sys.modules}, f
        )
    print("recorded", flush=True)


def leave(code: int) -> None:
    """Exit with ``code``."""
    sys.exit(code)
