"""Generate docs/proxyfl.md from run folders and bench JSON files (nothing in it is typed by hand).

The generator lives in :mod:`silofl.experiments.docs.proxyfl`; this script keeps the command named at the top of
the document it writes.
"""

import sys

from silofl.experiments.docs.proxyfl import main

if __name__ == "__main__":
    main(sys.argv[1:])
