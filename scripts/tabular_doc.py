"""Generate docs/tabular.md from the study written by `python -m silofl.experiments.tabular` (see
bench/tabular_study.sh).

The generator lives in :mod:`silofl.experiments.docs.tabular`; this script keeps the command named at the top of
the document it writes.
"""

import sys

from silofl.experiments.docs.tabular import main

if __name__ == "__main__":
    main(sys.argv[1:])
