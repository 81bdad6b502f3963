#!/usr/bin/env python3
"""Regenerate tools/rocky_vulkan/packaging/oe-rules.json from a `bitbake -e RECIPE` dump.

    PYTHONPATH=tools python3 tools/scripts/oe-rules-from-dump.py DUMP [--oe-core DIR] [--out FILE]

DUMP: e.g. OUT/rock-5-itx/llama-cpp.env from tools/scripts/bitbake-env.sh; --oe-core: the
openembedded-core checkout of that run (OUT/work/openembedded-core), for the two rules that are
code, not variables (insane.bbclass's ignored file dependencies, python3's manifest). Commit the
result; CI checks install trees against it (rocky_vulkan.packaging) without bitbake.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rocky_vulkan.packaging import oerules


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dump", type=Path)
    parser.add_argument("--oe-core", type=Path)
    parser.add_argument("--out", type=Path, default=Path(oerules.__file__).with_name(oerules.DATA))
    args = parser.parse_args()
    data = oerules.extract(args.dump.read_text(), args.oe_core)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(
        f"{args.out}: {len(data['files'])} FILES defaults, {len(data['error_qa'])} ERROR_QA tests"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
