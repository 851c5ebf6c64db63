"""Generate docs/combination.md from the runs of bench/combination_study.sh.

The generator lives in :mod:`silofl.experiments.docs.combination`; this script keeps the command named at the top
of the document it writes.
"""

import sys

from silofl.experiments.docs.combination import main

if __name__ == "__main__":
    main(sys.argv[1:])
