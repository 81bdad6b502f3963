"""doctor: each host problem gives FAIL/WARN with a fix. Hosts are injected as HostFacts values, or
as a PATH holding links to this machine's real tools minus the ones a test removes."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess

import pytest
from rocky_vulkan.cli import main
from rocky_vulkan.host import doctor
from rocky_vulkan.host.doctor import FAIL, GIB, PASS, WARN, HostFacts

from tests.helpers.project import ROOT


def good_host(**changes) -> HostFacts:
    facts = HostFacts(
        uid=1000,
        disk_path="/home/builder",
        free_disk_bytes=500 * GIB,
        mem_total_bytes=64 * GIB,
        cpus=16,
        tools={name: f"/usr/bin/{name}" for name in doctor.HOST_TOOLS},
        versions={
            "python3": "3.12.3",
            "git": "2.43.0",
            "gcc": "13.3.0",
            "tar": "1.35",
            "make": "4.3",
            "patch": "2.7.6",
        },
        locale_ok=True,
        userns_ok=True,
        kas="/home/builder/rocky/.venv/bin/kas",
        kas_version="5.5",
        kas_container="/home/builder/rocky/.venv/bin/kas-container",
        container_engine="/usr/bin/podman",
    )
    return dataclasses.replace(facts, **changes)


def by_check(findings, name):
    (found,) = [f for f in findings if f.check == name]
    return found


def test_good_host_passes_everything():
    findings = doctor.judge(good_host())
    assert {f.status for f in findings} == {PASS}
    assert not doctor.has_blocker(findings)


def test_root_is_a_blocker_natively_but_not_in_a_container():
    native = doctor.judge(good_host(uid=0))
    assert by_check(native, "user").status == FAIL
    assert "Do not use Bitbake as root" in by_check(native, "user").detail
    assert doctor.has_blocker(native)
    assert by_check(doctor.judge(good_host(uid=0), container=True), "user").status == WARN


@pytest.mark.parametrize(
    ("free_gb", "status"), [(500, PASS), (99, WARN), (40, WARN), (29, FAIL), (0, FAIL)]
)
def test_disk_thresholds(free_gb, status):
    finding = by_check(doctor.judge(good_host(free_disk_bytes=free_gb * GIB)), "disk")
    assert finding.status == status
    if status != PASS:
        assert "SSTATE_DIR" in finding.fix


def test_memory_and_cores():
    assert by_check(doctor.judge(good_host(mem_total_bytes=4 * GIB)), "memory").status == WARN
    low_per_core = by_check(doctor.judge(good_host(mem_total_bytes=16 * GIB, cpus=32)), "memory")
    assert low_per_core.status == WARN and "-j 8" in low_per_core.fix
    assert by_check(doctor.judge(good_host(cpus=2, mem_total_bytes=24 * GIB)), "memory").status == (
        WARN
    )


def test_missing_host_tool_names_the_debian_package():
    tools = dict(good_host().tools, chrpath=None, makeinfo=None)
    finding = by_check(doctor.judge(good_host(tools=tools)), "host tools")
    assert finding.status == FAIL
    assert "chrpath, makeinfo" in finding.detail
    assert finding.fix.startswith("sudo apt-get install chrpath texinfo ")


def test_old_tool_versions_fail():
    versions = dict(good_host().versions, git="1.7.1", python3="3.8.10")
    findings = doctor.judge(good_host(versions=versions))
    assert by_check(findings, "git version").status == FAIL
    assert by_check(findings, "python3 version").status == FAIL
    assert by_check(findings, "gcc version").status == PASS


def test_locale_and_user_namespaces():
    findings = doctor.judge(good_host(locale_ok=False, userns_ok=False))
    assert "locale-gen" in by_check(findings, "locale").fix
    assert "apparmor_restrict_unprivileged_userns" in by_check(findings, "user namespaces").fix
    assert by_check(doctor.judge(good_host(userns_ok=None)), "user namespaces").status == WARN


def test_kas_missing_wrong_version_and_container_alternative():
    missing = by_check(doctor.judge(good_host(kas=None)), "kas")
    assert missing.status == FAIL and "--container" in missing.detail
    old = by_check(doctor.judge(good_host(kas_version="4.7")), "kas")
    assert old.status == WARN and "kas==5.5" in old.fix
    container = doctor.judge(good_host(kas=None, tools={}), container=True)
    assert not doctor.has_blocker(container)  # host tools live inside the container
    no_engine = doctor.judge(good_host(container_engine=None), container=True)
    assert by_check(no_engine, "kas-container").status == FAIL


def test_locale_a_spelling_is_normalised():
    real = subprocess.run(["locale", "-a"], capture_output=True, text=True).stdout
    assert doctor.locale_available("C\nC.utf8\nen_US.utf8\n")
    assert not doctor.locale_available("C\nC.utf8\nPOSIX\n")
    # This host's real answer must agree with what Python's own locale switch says.
    import locale

    try:
        locale.setlocale(locale.LC_ALL, "en_US.UTF-8")
        works = True
    except locale.Error:
        works = False
    finally:
        locale.setlocale(locale.LC_ALL, "")
    assert doctor.locale_available(real) == works


def _path_of_real_tools(tmp_path, leave_out=()):
    """A bin dir of symlinks to this host's real tools, without `leave_out`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in [*doctor.HOST_TOOLS, "locale", "unshare"]:
        real = shutil.which(name)
        if real and name not in leave_out:
            (bin_dir / name).symlink_to(real)
    return str(bin_dir)


def test_gather_facts_reads_real_tools_and_sees_a_removed_one(tmp_path):
    path = _path_of_real_tools(tmp_path, leave_out=("chrpath",))
    facts = doctor.gather_facts(tmp_path / "build", path_env=path)
    assert facts.tools["chrpath"] is None
    git = shutil.which("git")
    if git:
        real = subprocess.run([git, "--version"], capture_output=True, text=True).stdout
        assert facts.versions["git"] in real
    assert facts.disk_path == str(tmp_path)  # build/ does not exist yet: its parent's disk
    assert abs(facts.free_disk_bytes - shutil.disk_usage(tmp_path).free) < GIB
    assert facts.cpus == os.cpu_count()
    assert facts.kas_version == "5.5"  # kas from the venv this test runs in
    assert by_check(doctor.judge(facts), "host tools").status == FAIL


def test_cli_exits_nonzero_on_a_blocker(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH: every host tool is missing
    rc = main(["--config", str(ROOT / "rocky-vulkan.yaml"), "doctor"])
    assert rc == 1
    out = capsys.readouterr()
    assert "host tools" in out.out and "FAIL" in out.out
    assert "fix the FAIL lines" in out.err
