"""A test-only stand-in for deqp-vk, and a fake vulkan-cts install around it.

VK-GL-CTS cannot be built in CI's time (hours of C++ and its own copies of glslang, SPIRV-Tools,
amber), so `rocky-selftest cts` is tested against this script instead. It takes the options
deqp-vk takes (only those `cts.deqp_command` passes, names as in VK-GL-CTS's
framework/common/tcuCommandLine.cpp; any other option fails like deqp's parser), reads the case
list file, and writes a QPA log in the writer's format (framework/qphelper/qpTestLog.c,
qpXmlWriter.c) for each case. Environment variables make it misbehave:

    FAKE_DEQP_STATUS   JSON file {case: StatusCode} (default Pass)
    FAKE_DEQP_CRASH    a case: SIGSEGV right after its #beginTestCaseResult
    FAKE_DEQP_HANG     a case: sleep for ever after its #beginTestCaseResult
    FAKE_DEQP_MISSING  comma-separated cases this "binary" does not have (skipped silently)
    FAKE_DEQP_STARTUP  exit with this status before the log is opened
    FAKE_DEQP_SLEEP    seconds per case
    FAKE_DEQP_CALLS    file to which each call's argv is appended (one JSON line)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The options deqp-vk has (tcuCommandLine.cpp registerOptions) that the self-test uses.
REAL_OPTIONS = {
    "--deqp-caselist-file",
    "--deqp-log-filename",
    "--deqp-log-images",
    "--deqp-log-shader-sources",
    "--deqp-archive-dir",
    "--deqp-shadercache-filename",
}

SCRIPT = r"""
import json, os, signal, sys, time

REAL = set(json.loads(sys.argv[1]))
args = sys.argv[2:]
opts = {}
for arg in args:
    name, eq, value = arg.partition("=")
    if name not in REAL or not eq:
        print(f"deqp-vk: unknown or malformed option {arg}", file=sys.stderr)
        sys.exit(1)
    opts[name] = value
for name in ("--deqp-log-images", "--deqp-log-shader-sources"):
    if opts.get(name, "disable") not in ("enable", "disable"):
        sys.exit(1)
if os.environ.get("FAKE_DEQP_CALLS"):
    with open(os.environ["FAKE_DEQP_CALLS"], "a") as f:
        f.write(json.dumps(args) + "\n")
if os.environ.get("FAKE_DEQP_STARTUP"):
    print("Failed to create a Vulkan instance", file=sys.stderr)
    sys.exit(int(os.environ["FAKE_DEQP_STARTUP"]))
status = {}
if os.environ.get("FAKE_DEQP_STATUS"):
    status = json.load(open(os.environ["FAKE_DEQP_STATUS"]))
missing = set(filter(None, os.environ.get("FAKE_DEQP_MISSING", "").split(",")))
cases = [l.strip() for l in open(opts["--deqp-caselist-file"]) if l.strip()]
log = open(opts["--deqp-log-filename"], "w")
def out(text):
    log.write(text)
    log.flush()
out('#sessionInfo releaseName stand-in\n#sessionInfo releaseId 0x00000000\n'
    '#sessionInfo targetName "Surfaceless"\n#beginSession\n')
passed = 0
for case in cases:
    if case in missing:
        continue
    out(f"\n#beginTestCaseResult {case}\n")
    out('<?xml version="1.0" encoding="UTF-8"?>\n')
    out(f'<TestCaseResult Version="0.3.4" CasePath="{case}" CaseType="SelfValidate">\n')
    if case == os.environ.get("FAKE_DEQP_CRASH"):
        os.kill(os.getpid(), signal.SIGSEGV)
    if case == os.environ.get("FAKE_DEQP_HANG"):
        while True:
            time.sleep(60)
    time.sleep(float(os.environ.get("FAKE_DEQP_SLEEP", "0")))
    code = status.get(case, "Pass")
    out(f' <Text>checked {case}</Text>\n <Result StatusCode="{code}">{code}</Result>\n')
    out("</TestCaseResult>\n\n#endTestCaseResult\n")
    passed += 1
out("\n#endSession\n")
# What deqp prints at the end; the self-test must not believe it.
print(f"Test run totals:\n  Passed:        {len(cases)}/{len(cases)} (100.0%)")
"""


def install(root: Path, groups: dict[str, list[str]], nested: bool = False) -> Path:
    """A fake /usr/lib/vulkan-cts under `root`: the stand-in as deqp-vk and mustpass lists
    (mustpass/main/vk-default.txt naming vk-default/<group>.txt per group). With `nested`, the
    index names one list of lists, as deqp also reads them."""
    cts_dir = root / "vulkan-cts"
    main = cts_dir / "mustpass" / "main"
    (main / "vk-default").mkdir(parents=True)
    names = []
    for group, cases in groups.items():
        (main / "vk-default" / f"{group}.txt").write_text("".join(c + "\n" for c in cases))
        names.append(f"vk-default/{group}.txt")
    if nested:
        (main / "vk-default" / "all.txt").write_text("".join(n + "\n" for n in names))
        names = ["vk-default/all.txt"]
    (main / "vk-default.txt").write_text("".join(n + "\n" for n in names))
    deqp = cts_dir / "deqp-vk"
    deqp.write_text(
        f"#!/bin/sh\nexec {sys.executable} {cts_dir / 'stand_in.py'} "
        f"'{json.dumps(sorted(REAL_OPTIONS))}' \"$@\"\n"
    )
    deqp.chmod(0o755)
    (cts_dir / "stand_in.py").write_text(SCRIPT)
    return cts_dir


def cases(group: str, n: int) -> list[str]:
    return [f"dEQP-VK.{group}.case_{i}" for i in range(n)]


def calls(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def status_file(tmp: Path, statuses: dict[str, str]) -> str:
    path = tmp / "statuses.json"
    path.write_text(json.dumps(statuses))
    return str(path)


def qpa_case(case: str, status: str | None, text: str = "ok", end: str = "end") -> str:
    """One case as deqp's writer logs it; `end` is 'end', 'none' (crashed) or a terminate code."""
    body = (
        f"\n#beginTestCaseResult {case}\n"
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<TestCaseResult Version="0.3.4" CasePath="{case}" CaseType="SelfValidate">\n'
        f" <Text>{text}</Text>\n"
    )
    if end == "none":
        return body
    if end != "end":
        return body + f"\n#terminateTestCaseResult {end}\n"
    if status is not None:
        body += f' <Result StatusCode="{status}">{status}</Result>\n'
    return body + "</TestCaseResult>\n\n#endTestCaseResult\n"


SESSION = (
    "#sessionInfo releaseName git-a02761593aedeb1d3941ddd344ca35d7a2f9de46\n"
    "#sessionInfo releaseId 0xa0276159\n"
    '#sessionInfo targetName "Surfaceless"\n'
    "#beginSession\n"
)


def env_of(**values: str) -> dict[str, str]:
    return {f"FAKE_DEQP_{k.upper()}": v for k, v in values.items()}
