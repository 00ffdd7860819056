"""`python -m judgetrain.bench`: the command, and the entry of the bench's worker subprocesses
(`_worker SPEC RESULT`)."""

import sys

from judgetrain.bench.cli import main

sys.exit(main())
