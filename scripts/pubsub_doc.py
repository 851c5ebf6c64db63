"""Generate docs/pubsub.md from the scenario folders written by `silofl pubsub scenario` (see

The generator lives in :mod:`silofl.experiments.docs.pubsub`; this script keeps the command named at the top of
the document it writes.
"""

import sys

from silofl.experiments.docs.pubsub import main

if __name__ == "__main__":
    main(sys.argv[1:])
