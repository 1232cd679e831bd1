"""`python -m api.cli`: the `tally` command (tests and benchmarks run it this way)."""

import sys

from api.cli import main

sys.exit(main())
