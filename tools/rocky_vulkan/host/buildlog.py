"""Read kas/bitbake output lines: task progress, and known opaque failures turned into fixes.

The patterns are the exact texts kas 5.5, oe-core's scripts/sanity.bbclass and bitbake 2.18 print
(see tests/fixtures/kas-output/ for captured real runs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# bitbake knotty, non-interactive: "NOTE: Running task 12 of 3456 (/x/zlib_1.3.bb:do_fetch)"
_TASK = re.compile(r"NOTE: Running (?:setscene |noexec )?task (\d+) of (\d+) \((.+)\)")


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    task: str
    setscene: bool


def parse_progress(line: str) -> Progress | None:
    match = _TASK.search(line)
    if not match:
        return None
    task = match.group(3)
    # "/path/recipes/zlib/zlib_1.3.bb:do_fetch" -> "zlib_1.3.bb:do_fetch"
    task = task.rsplit("/", 1)[-1]
    return Progress(int(match.group(1)), int(match.group(2)), task, "setscene" in match.group(0))


@dataclass(frozen=True)
class Diagnosis:
    key: str
    cause: str
    fix: str


@dataclass(frozen=True)
class _Rule:
    key: str
    pattern: re.Pattern[str]
    cause: str
    fix: str
    fallback: bool = False  # only when no other rule matched


def _rule(key: str, pattern: str, cause: str, fix: str, fallback: bool = False) -> _Rule:
    return _Rule(key, re.compile(pattern), cause, fix, fallback)


OFFLINE = (
    "to build without network: `rocky-vulkan build --fragment offline` (plain kas: "
    ":kas/offline.yml), which needs every source in DL_DIR and the layer repos already cloned "
    "in the checkout or reachable through KAS_PREMIRRORS (docs/user/build.md, 'Building offline')"
)


RULES = (
    _rule(
        "missing-bitbake",
        r"The bitbake directory \((?P<path>[^)]+)\) does not exist",
        "kas found openembedded-core but no bitbake checkout beside it ({path})",
        "add the `bitbake` repo (branch 2.18, pinned commit) to repos: in rocky-vulkan.yaml, "
        "run `rocky-vulkan render`, and build again",
    ),
    _rule(
        "missing-oe-core",
        r"Did not find any init-build-env script",
        "no repo in the kas files provides oe-init-build-env (openembedded-core is missing)",
        "add openembedded-core (and bitbake) to repos: in rocky-vulkan.yaml, then "
        "`rocky-vulkan render`",
    ),
    _rule(
        "unpinned-repo",
        r'Using (?:branch|tag) without commit for repository "(?P<repo>[^"]+)"',
        "repo {repo!r} is not pinned to a commit: the build is not reproducible",
        "give {repo!r} a full `commit:` in rocky-vulkan.yaml and run `rocky-vulkan render` "
        "(kas/base.lock.yml then pins it)",
    ),
    _rule(
        "network-clone",
        r"(?:Could not resolve host|Failed to connect to|Connection timed out|"
        r"Network is unreachable|Temporary failure in name resolution): ?(?P<host>\S*)",
        "the network is down or blocked while kas/bitbake fetched sources ({host})",
        "check the connection and proxy (http_proxy/https_proxy are passed through); " + OFFLINE,
    ),
    _rule(
        "network-fetch",
        r"Unable to fetch URL from any source|Fetcher failure for URL: '(?P<url>[^']+)'",
        "bitbake could not download a source ({url})",
        "check the network/proxy; if a mirror is gone, put the file in DL_DIR by hand; " + OFFLINE,
    ),
    _rule(
        "no-network-allowed",
        r"Network access disabled through BB_NO_NETWORK",
        "an offline build (--fragment offline, kas/offline.yml) needed a source that is not "
        "in DL_DIR",
        "build once with the network (without --fragment offline / :kas/offline.yml) to fill "
        "DL_DIR, or copy DL_DIR from a host that has it",
    ),
    _rule(
        "root",
        r"Do not use Bitbake as root",
        "the build ran as root, which bitbake refuses",
        "build as a normal user, or use `rocky-vulkan build --container`",
    ),
    _rule(
        "userns",
        r"User namespaces are not usable by BitBake",
        "the host forbids unprivileged user namespaces (Ubuntu 24.04+ AppArmor)",
        "sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0, or use --container",
    ),
    _rule(
        "locale",
        r"Your system needs to support the en_US.UTF-8 locale",
        "the host lacks the en_US.UTF-8 locale",
        "sudo locale-gen en_US.UTF-8 (Debian: enable it in /etc/locale.gen first)",
    ),
    _rule(
        "disk-full",
        r"disk space monitor action is|No space left on device",
        "the disk holding the build, DL_DIR or SSTATE_DIR is full",
        "free space (100 GB for a first build) or move KAS_BUILD_DIR/SSTATE_DIR to a bigger disk; "
        "rm_work is already on",
    ),
    # kas-container and its engines (kas-container 5.5's fatal_error texts; docker's and
    # podman's own messages when the engine does not answer).
    _rule(
        "container-root",
        r"Running as root - may break certain recipes",
        "kas-container refuses to run as root",
        "build as a normal user who may use docker (`sudo usermod -aG docker USER`, then log in "
        "again) or podman; or `export KAS_ALLOW_ROOT=yes` to override",
    ),
    _rule(
        "docker-down",
        r"Cannot connect to the Docker daemon(?: at (?P<where>[^ ]+?))?\.? Is the docker daemon",
        "docker's daemon is not running ({where})",
        "start it: `sudo systemctl enable --now docker`; `docker info` must answer "
        "(`rocky-vulkan doctor --container` checks it)",
    ),
    _rule(
        "docker-permission",
        r"permission denied while trying to connect to the (?:Docker daemon|docker API)",
        "this user may not use docker's socket",
        "`sudo usermod -aG docker $USER`, then log out and in; or rootless podman "
        "(export KAS_CONTAINER_ENGINE=podman)",
    ),
    _rule(
        "podman-down",
        r"Cannot connect to Podman",
        "podman cannot reach its service",
        "`podman info` must answer: `podman system connection list`; on a VM "
        "`podman machine start`",
    ),
    _rule(
        "no-engine",
        r"no container engine found, need docker or podman",
        "kas-container found neither docker nor podman",
        "sudo apt-get install podman (or docker.io)",
    ),
    _rule(
        "kas-container",
        r"kas-container: Error: (?P<message>.+)",
        "kas-container stopped: {message}",
        "do what it says; `rocky-vulkan doctor --container` checks root, the engine and "
        "kas-container before a build",
        fallback=True,
    ),
)


def diagnose(lines: list[str]) -> list[Diagnosis]:
    """Every known failure found in the output, once each, in the order of RULES."""
    found: dict[str, Diagnosis] = {}
    for rule in RULES:
        if rule.fallback and found:
            continue
        for line in lines:
            match = rule.pattern.search(line)
            if match:
                groups = {k: (v or "?") for k, v in match.groupdict().items()}
                found[rule.key] = Diagnosis(
                    rule.key, rule.cause.format(**groups), rule.fix.format(**groups)
                )
                break
    return list(found.values())
