"""Generate docs/client_dp.md from a `silofl compare --config bench/client_dp_study.yaml` folder.

The generator lives in :mod:`silofl.experiments.docs.client_dp`; this script keeps the command named at the top of
the document it writes.
"""

import sys

from silofl.experiments.docs.client_dp import main

if __name__ == "__main__":
    main(sys.argv[1:])
