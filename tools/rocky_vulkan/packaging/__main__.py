import sys

from rocky_vulkan.packaging.cli import main

sys.exit(main())
