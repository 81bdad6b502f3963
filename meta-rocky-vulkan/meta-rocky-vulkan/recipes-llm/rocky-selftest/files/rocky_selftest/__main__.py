"""`python3 -m rocky_selftest` / `python3 -m rocky_vulkan.selftest`."""

import sys

from .cli import main

sys.exit(main())
