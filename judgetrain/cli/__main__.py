"""`python -m judgetrain.cli COMMAND ...`: the `judgetrain` console script."""

import sys

from judgetrain.cli import main

sys.exit(main())
