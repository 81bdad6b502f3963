"""Lint: real oelint-adv and kas's own schema; findings and crashes give distinct exit codes."""

from __future__ import annotations

import stat
import textwrap

from rocky_vulkan.cli import main
from rocky_vulkan.config import load_config
from rocky_vulkan.layer import lint

from tests.helpers.project import ROOT


def test_main_tree_is_lint_clean():
    results = lint.run_checks(load_config(ROOT / "rocky-vulkan.yaml"))
    assert [(r.name, r.findings, r.crashed) for r in results if r.status != "ok"] == []


def test_oelint_finding_fails_lint(project):
    recipe = project / "meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm/llama-cpp/llama-cpp_git.bb"
    recipe.write_text(recipe.read_text().replace('SECTION = "libs"\n', ""))
    result = lint.check_oelint(load_config(project / "rocky-vulkan.yaml"))
    assert result.status == "FAIL"
    assert any("SECTION" in f for f in result.findings)


def test_oelint_crash_is_reported_as_crash(project, monkeypatch, tmp_path):
    # Fault injection: an oelint-adv that dies the way a linter bug does (exit 70).
    fake = tmp_path / "oelint-adv"
    fake.write_text("#!/bin/sh\necho 'Traceback (most recent call last):' >&2\nexit 70\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}")
    results = [lint.check_oelint(load_config(project / "rocky-vulkan.yaml"))]
    assert results[0].status == "CRASH"
    assert lint.exit_code(results) == lint.EXIT_CRASH


def test_kas_schema_rejects_bad_kas_file(project):
    bad = project / "kas" / "rock-5-itx.yml"
    bad.write_text("header:\n  version: 99\nmachine: [not, a, string]\n")
    result = lint.check_kas(load_config(project / "rocky-vulkan.yaml"))
    assert result.status == "FAIL"
    assert any("rock-5-itx.yml: header/version" in f for f in result.findings)
    assert any("rock-5-itx.yml: machine" in f for f in result.findings)


def test_unpinned_lock_is_a_finding(project):
    lock = project / "kas" / "base.lock.yml"
    lock.write_text(
        lock.read_text().replace(
            "commit: fae9db3168dbff1b8c76fe9c6726a9687ff97514", "commit: master"
        )
    )
    result = lint.check_kas(load_config(project / "rocky-vulkan.yaml"))
    assert any("bitbake is not pinned by full commit" in f for f in result.findings)


GOOD_PATCH = textwrap.dedent("""\
    From 1111111111111111111111111111111111111111 Mon Sep 17 00:00:00 2001
    From: A Developer <dev@example.org>
    Subject: [PATCH] thing: do it right

    Because.

    Upstream-Status: Pending
    Signed-off-by: A Developer <dev@example.org>
    ---
    diff --git a/x b/x
    """)


def test_patch_hygiene():
    assert lint.patch_problems(GOOD_PATCH) == []
    assert any(
        "Upstream-Status" in p
        for p in lint.patch_problems(GOOD_PATCH.replace("Upstream-Status: Pending\n", ""))
    )
    assert any(
        "Signed-off-by" in p
        for p in lint.patch_problems(GOOD_PATCH.replace("Signed-off-by:", "Acked-by:"))
    )
    assert any("format-patch" in p for p in lint.patch_problems(GOOD_PATCH.split("\n", 1)[1]))


def test_upstream_patches_need_no_upstream_status_but_the_rest(project):
    # patches/upstream/ holds patches for sending upstream: no recipe applies them, so OE's
    # Upstream-Status is not asked for there; the shipped patches in patches/ still need it.
    no_status = GOOD_PATCH.replace("Upstream-Status: Pending\n", "")
    assert lint.upstream_patch_problems(no_status) == []
    assert any(
        "Signed-off-by" in p
        for p in lint.upstream_patch_problems(no_status.replace("Signed-off-by:", "Acked-by:"))
    )
    upstream = project / "patches" / "upstream"
    upstream.mkdir(exist_ok=True)
    (upstream / "x-good.patch").write_text(no_status)
    (upstream / "x-bad.patch").write_text(no_status.split("\n", 1)[1])
    (project / "patches" / "x-shipped.patch").write_text(no_status)
    findings = lint.check_patches(load_config(project / "rocky-vulkan.yaml")).findings
    assert [f for f in findings if "x-" in f] == [
        "patches/x-shipped.patch: no valid `Upstream-Status:` line",
        "patches/upstream/x-bad.patch: not in `git format-patch` form "
        "(From <sha>/Subject: header missing)",
    ]


def test_cli_lint_exit_codes(project, capsys):
    cfg = str(project / "rocky-vulkan.yaml")
    assert main(["--config", cfg, "lint"]) == 0
    conf = project / "meta-rocky-vulkan/meta-rocky-vulkan/conf/layer.conf"
    conf.write_text(conf.read_text() + "# drift\n")
    assert main(["--config", cfg, "lint"]) == lint.EXIT_FINDINGS
    assert "differs from a fresh render" in capsys.readouterr().out
