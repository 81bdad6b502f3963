"""rocky-selftest: the on-board first-boot self-test (Python standard library only).

It runs on the board with OE's python3, so nothing here may import outside the standard library
or outside this package (imports are relative so the layer can install it as `rocky_selftest`).
"""

RESULT_SCHEMA = "rocky-selftest-result"
RESULT_SCHEMA_VERSION = 1
CONFIG_SCHEMA_VERSION = 1
