"""Generate docs/audit.md from the audit folders of `bash bench/audit_study.sh`.

The generator lives in :mod:`silofl.experiments.docs.audit`; this script keeps the command named at the top of
the document it writes.
"""

import sys

from silofl.experiments.docs.audit import main

if __name__ == "__main__":
    main(sys.argv[1:])
