"""``silofl deploy local`` with a delay between the sites and the SuperLink (``bench/deployment.py``'s
``flower+20ms``): every chunk held ``DELAY_MS`` each way by :class:`bench.relay.DelayRelay`, hooked in through
:data:`silofl.deploy.local.SITE_RELAY`; then the command as the CLI runs it, in this process.

    python bench/delayed_deploy.py DELAY_MS deploy local --sites 4 … --out DIR
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ (the repository's, not installed)

from bench.relay import DelayRelay  # noqa: E402
from silofl.cli.main import app  # noqa: E402
from silofl.deploy import local  # noqa: E402


def main(argv: list[str]) -> None:
    """Set the relay, then run ``silofl ARGV[1:]``."""
    local.SITE_RELAY = functools.partial(DelayRelay, delay_s=float(argv[0]) / 1000)
    app(args=argv[1:], prog_name="silofl")


if __name__ == "__main__":
    main(sys.argv[1:])
