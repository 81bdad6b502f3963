"""`rocky-vulkan lint`: render check, oelint-adv, kas schema and patch hygiene, with exit
codes a CI can trust: 0 clean, 1 findings, 3 a checker itself crashed or is missing."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import yaml

from rocky_vulkan.config import PATCH_DIR_NAME, Config, load_config
from rocky_vulkan.layer.manifest import CTS_FRAGMENT, KAS_DIR, LAYER_DIR
from rocky_vulkan.layer.render import diff_against_disk

EXIT_FINDINGS = 1
EXIT_CRASH = 3

# Layer-wide oelint-adv suppressions, each with its reason. Recipe-specific ones are inline
# (`# nooelint: rule - reason`) in the templates.
OELINT_SUPPRESSIONS = {
    "oelint.vars.homepageping": "needs the network; CI and offline builders have none",
}
# meta-rockchip's SoC overrides, which oelint-adv's built-in tables do not know.
ROCKCHIP_OVERRIDES = ("rockchip", "rk3588", "rk3588s")


@dataclass
class CheckResult:
    name: str
    findings: list[str] = field(default_factory=list)
    crashed: str | None = None

    @property
    def status(self) -> str:
        if self.crashed:
            return "CRASH"
        return "FAIL" if self.findings else "ok"


def check_render(cfg: Config) -> CheckResult:
    result = CheckResult("render --check")
    diff = diff_against_disk(cfg)
    if diff:
        changed = sorted(set(re.findall(r"^\+\+\+ b/(\S+)|^--- a/(\S+)", diff, re.M)))
        files = sorted({a or b for a, b in changed})
        result.findings.append(
            "generated tree differs from a fresh render (run `rocky-vulkan render`): "
            + ", ".join(files)
        )
    return result


def recipe_files(layer: Path) -> list[Path]:
    return sorted(p for p in layer.rglob("*") if p.suffix in (".bb", ".bbappend"))


def _oelint_constants(cfg: Config) -> dict:
    machines = [m.name for m in cfg.machines] + list(ROCKCHIP_OVERRIDES)
    # oe-core mesa.inc's variable our Mesa bbappend sets, and the image's own variables
    # that oelint-adv's fuzzy spelling check takes for typos of known ones.
    variables = [
        "GALLIUMDRIVERS_SOFTPIPE",
        "ROCKY_MODEL_TERMS_OK",
        "ROCKY_MODEL_TERMS_MSG",
        "ROCKY_SERVE_TERMS_OK",
        "ROCKY_SERVE_TERMS_MSG",
    ]
    return {
        "replacements": {"machines": machines, "distros": [cfg.distro]},
        "variables": {"known": variables},
    }


def check_oelint(cfg: Config) -> CheckResult:
    result = CheckResult("oelint-adv --release " + cfg.release)
    exe = shutil.which("oelint-adv") or str(Path(sys.executable).with_name("oelint-adv"))
    if not Path(exe).exists():
        result.crashed = "oelint-adv is not installed: run `pip install -e '.[dev]'`"
        return result
    files = recipe_files(cfg.root / LAYER_DIR)
    if not files:
        result.findings.append(f"no recipes found under {LAYER_DIR}/: run `rocky-vulkan render`")
        return result
    with tempfile.TemporaryDirectory() as tmp:
        consts = Path(tmp, "constants.json")
        consts.write_text(json.dumps(_oelint_constants(cfg)))
        cmd = [
            exe,
            "--release",
            cfg.release,
            "--quiet",
            "--relpaths",
            "--jobs",
            "1",
            f"--constantmods=+{consts}",
        ]
        for rule in OELINT_SUPPRESSIONS:
            cmd += ["--suppress", rule]
        proc = subprocess.run(
            cmd + [str(f) for f in files], capture_output=True, text=True, cwd=cfg.root
        )
    output = (proc.stdout + proc.stderr).strip()
    if proc.returncode == 0 and not output:
        return result
    if proc.returncode in (0, 1) and "Traceback" not in output:
        result.findings.extend(output.splitlines() or [f"oelint-adv exited {proc.returncode}"])
        return result
    tail = "\n".join(output.splitlines()[-5:])
    result.crashed = f"oelint-adv crashed (exit {proc.returncode}): {tail}"
    return result


def kas_schema() -> dict:
    from kas.configschema import CONFIGSCHEMA  # kas's own schema, from the installed package

    return CONFIGSCHEMA


def check_kas(cfg: Config) -> CheckResult:
    result = CheckResult("kas schema")
    try:
        validator = jsonschema.Draft7Validator(kas_schema())
    except ImportError:
        result.crashed = "kas is not installed: run `pip install -e '.[dev]'`"
        return result
    kas_files = sorted((cfg.root / KAS_DIR).glob("*.yml"))
    if not kas_files:
        result.findings.append(f"no kas files in {KAS_DIR}/: run `rocky-vulkan render`")
    for path in kas_files:
        rel = path.relative_to(cfg.root)
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as err:
            result.findings.append(f"{rel}: not valid YAML: {err}")
            continue
        for err in validator.iter_errors(data):
            where = "/".join(map(str, err.absolute_path)) or "(top level)"
            result.findings.append(f"{rel}: {where}: {err.message}")
        for name, repo in (data.get("repos") or {}).items():
            if repo and repo.get("url") and path.name != "base.yml":
                if _fragment_repo(cfg, path.name, name, repo):
                    continue
                result.findings.append(f"{rel}: repo {name} belongs in kas/base.yml")
    lock = cfg.root / KAS_DIR / "base.lock.yml"
    if lock.exists():
        locked = (yaml.safe_load(lock.read_text()).get("overrides") or {}).get("repos") or {}
        for repo in cfg.repos:
            commit = (locked.get(repo.name) or {}).get("commit", "")
            if not re.fullmatch(r"[0-9a-f]{40}", commit or ""):
                result.findings.append(f"{lock.name}: {repo.name} is not pinned by full commit")
    else:
        result.findings.append(f"{KAS_DIR}/base.lock.yml is missing: run `rocky-vulkan render`")
    return result


def _fragment_repo(cfg: Config, file_name: str, name: str, repo: dict) -> bool:
    """Whether `name` is the repo the vulkan-cts fragment may add (it only), pinned there by
    the config's full commit."""
    cts = cfg.vulkan_cts.repo if cfg.vulkan_cts else None
    fragment = CTS_FRAGMENT.rsplit("/", 1)[1]
    return (
        cts is not None
        and file_name == fragment
        and name == cts.name
        and repo.get("commit") == cts.commit
        and re.fullmatch(r"[0-9a-f]{40}", str(repo.get("commit") or "")) is not None
    )


def patch_problems(text: str) -> list[str]:
    """What keeps a patch from being mergeable upstream and acceptable to OE."""
    problems = []
    if not re.search(r"^From [0-9a-f]{40} ", text, re.M) or not re.search(
        r"^Subject: ", text, re.M
    ):
        problems.append("not in `git format-patch` form (From <sha>/Subject: header missing)")
    if not re.search(
        r"^Upstream-Status: (Pending|Submitted \[.+\]|Backport \[.+\]|"
        r"Denied|Inappropriate \[.+\]|Inactive-Upstream)",
        text,
        re.M,
    ):
        problems.append("no valid `Upstream-Status:` line")
    if not re.search(r"^Signed-off-by: .+ <.+@.+>", text, re.M):
        problems.append("no `Signed-off-by:` line")
    if not re.search(r"^diff --git ", text, re.M):
        problems.append("contains no diff")
    return problems


# patches/upstream/: patches for sending to their project, which no recipe applies.
UPSTREAM_DIR_NAME = "upstream"


def upstream_patch_problems(text: str) -> list[str]:
    """What keeps a patch meant for sending upstream (not shipped) from being sendable: the
    rules of `patch_problems` but `Upstream-Status:`, an OE tag for patches a layer carries."""
    return [p for p in patch_problems(text) if "Upstream-Status" not in p]


def check_patches(cfg: Config) -> CheckResult:
    result = CheckResult("patch hygiene")
    patch_dir = cfg.root / PATCH_DIR_NAME
    for path in sorted(patch_dir.glob("*.patch")) if patch_dir.is_dir() else []:
        for problem in patch_problems(path.read_text(errors="replace")):
            result.findings.append(f"{PATCH_DIR_NAME}/{path.name}: {problem}")
    upstream_dir = patch_dir / UPSTREAM_DIR_NAME
    for path in sorted(upstream_dir.glob("*.patch")) if upstream_dir.is_dir() else []:
        for problem in upstream_patch_problems(path.read_text(errors="replace")):
            result.findings.append(f"{PATCH_DIR_NAME}/{UPSTREAM_DIR_NAME}/{path.name}: {problem}")
    return result


CHECKS = (check_render, check_oelint, check_kas, check_patches)


def run_checks(cfg: Config) -> list[CheckResult]:
    return [check(cfg) for check in CHECKS]


def exit_code(results: list[CheckResult]) -> int:
    if any(r.crashed for r in results):
        return EXIT_CRASH
    return EXIT_FINDINGS if any(r.findings for r in results) else 0


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    cfg = load_config(args.config)
    results = run_checks(cfg)
    console = Console(stderr=False, highlight=False)
    table = Table(title="rocky-vulkan lint")
    table.add_column("check")
    table.add_column("result")
    table.add_column("findings", justify="right")
    for r in results:
        colour = {"ok": "green", "FAIL": "red", "CRASH": "magenta"}[r.status]
        table.add_row(r.name, f"[{colour}]{r.status}[/{colour}]", str(len(r.findings)))
    console.print(table)
    for r in results:
        for line in r.findings:
            console.print(f"{r.name}: {line}", markup=False)
        if r.crashed:
            console.print(f"{r.name}: {r.crashed}", markup=False)
    return exit_code(results)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "lint",
        help="render check, oelint-adv, kas schema and patch hygiene (exit 0/1/3)",
        description="Check the generated tree without building: it matches a fresh render, "
        "the recipes are clean for oelint-adv (--release of the config), the kas files "
        "validate against kas's own schema, and every patch carries Upstream-Status and "
        "Signed-off-by. Exit 0: "
        "all pass; 1: a finding; 3: a checker could not run.",
    )
    parser.set_defaults(func=_run)
