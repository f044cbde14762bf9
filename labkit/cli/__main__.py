"""`python -m labkit.cli ...`: the `labkit` command (the tests run it this way, with this interpreter)."""

import sys

from labkit.cli import main

sys.exit(main())
