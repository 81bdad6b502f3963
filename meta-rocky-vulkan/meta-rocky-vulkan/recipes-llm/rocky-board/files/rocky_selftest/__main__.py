"""`python3 -m rocky_selftest`: the self-test without the console script."""

import sys

from .cli import main

sys.exit(main())
