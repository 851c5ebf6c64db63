"""Generate docs/results.md from `silofl compare` report folders (no figure is typed by hand).

The generator lives in :mod:`silofl.experiments.docs.results`; this script keeps the command named at the top of
the document it writes.
"""

import sys

from silofl.experiments.docs.results import main

if __name__ == "__main__":
    main(sys.argv[1:])
