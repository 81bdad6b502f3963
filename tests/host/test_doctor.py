"""doctor: each host problem gives FAIL/WARN with a fix. Hosts are injected as HostFacts values, or
as a PATH holding links to this machine's real tools minus the ones a test removes."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys

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


def test_root_is_a_blocker_natively_and_in_a_container_without_kas_allow_root():
    native = doctor.judge(good_host(uid=0))
    assert by_check(native, "user").status == FAIL
    assert "Do not use Bitbake as root" in by_check(native, "user").detail
    assert doctor.has_blocker(native)
    # kas-container 5.5: `Running as root ... Set KAS_ALLOW_ROOT=yes to override.`
    container = by_check(doctor.judge(good_host(uid=0), container=True), "user")
    assert container.status == FAIL
    assert "Running as root - may break certain recipes" in container.detail
    assert "KAS_ALLOW_ROOT=yes" in container.fix and "usermod -aG docker" in container.fix
    allowed = doctor.judge(good_host(uid=0, kas_allow_root=True), container=True)
    assert by_check(allowed, "user").status == WARN


@pytest.mark.parametrize(
    ("name", "error", "fix"),
    [
        (
            "docker",
            "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker "
            "daemon running?",
            "systemctl enable --now docker",
        ),
        (
            "docker",
            "permission denied while trying to connect to the Docker daemon socket at "
            "unix:///var/run/docker.sock",
            "usermod -aG docker",
        ),
        ("podman", "Error: cannot connect to Podman", "podman machine start"),
        ("docker", "`docker info` did not answer within 30 s", "systemctl enable --now docker"),
    ],
)
def test_a_container_engine_that_does_not_answer_is_a_blocker(name, error, fix):
    host = good_host(
        container_engine=f"/usr/bin/{name}", container_engine_name=name, engine_error=error
    )
    finding = by_check(doctor.judge(host, container=True), "container engine")
    assert finding.status == FAIL
    assert error in finding.detail and fix in finding.fix
    native = doctor.judge(host)  # a native build does not need the engine
    assert "container engine" not in {f.check for f in native}


def test_an_unknown_kas_container_engine_is_named():
    host = good_host(container_engine="/usr/bin/lxc", container_engine_name="lxc")
    finding = by_check(doctor.judge(host, container=True), "container engine")
    assert finding.status == FAIL and "KAS_CONTAINER_ENGINE=lxc" in finding.detail


def _fake_engine(bin_dir, name="docker", version="Docker version 28.2.2, build e6534b4"):
    """Fault injection: an engine client that answers like the real one whose daemon is stopped
    (docker 28's texts, as the real client prints them on a host without the daemon). A real
    engine cannot be stopped on demand in a test."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / name
    script.write_text(
        "#!/bin/sh\n"
        f'case "$1" in\n  -v) echo "{version}" ;;\n'
        "  *) echo 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
        "Is the docker daemon running?' >&2; exit 1 ;;\nesac\n"
    )
    script.chmod(0o755)
    return script


def test_gather_facts_picks_the_engine_as_kas_container_does_and_asks_it(tmp_path):
    bin_dir = tmp_path / "bin"
    docker = _fake_engine(bin_dir)
    facts = doctor.gather_facts(tmp_path, path_env=str(bin_dir), container=True, environ={})
    assert (facts.container_engine, facts.container_engine_name) == (str(docker), "docker")
    assert facts.engine_error.startswith("Cannot connect to the Docker daemon")
    native = doctor.gather_facts(tmp_path, path_env=str(bin_dir), environ={})
    assert native.engine_error is None  # only a container build asks the engine
    # podman's docker shim does not say "Docker": kas-container then uses podman.
    _fake_engine(bin_dir, version="podman version 4.3.1")
    podman = _fake_engine(bin_dir, name="podman", version="podman version 4.3.1")
    facts = doctor.gather_facts(tmp_path, path_env=str(bin_dir), container=True, environ={})
    assert (facts.container_engine, facts.container_engine_name) == (str(podman), "podman")
    chosen = doctor.pick_engine(str(bin_dir), {"KAS_CONTAINER_ENGINE": "docker"})
    assert chosen == ("docker", str(bin_dir / "docker"))


def _as_root() -> list[str]:
    """A prefix that runs a command with uid 0: nothing as root, else a user namespace."""
    if os.geteuid() == 0:
        return []
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-r", "true"], capture_output=True).returncode == 0:
        return [unshare, "-r"]
    pytest.skip("needs root or unprivileged user namespaces (unshare -r)")


def test_cli_doctor_container_as_root_with_a_stopped_engine(tmp_path):
    """The real `rocky-vulkan doctor --container`, with uid 0, KAS_ALLOW_ROOT unset and a docker
    whose daemon is stopped (the fake above): exit 1, both problems named with their fixes."""
    _fake_engine(tmp_path / "bin")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAS_")}
    env.update(PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", COLUMNS="400")
    done = subprocess.run(
        [*_as_root(), sys.executable, "-m", "rocky_vulkan.cli", "--config"]
        + [str(ROOT / "rocky-vulkan.yaml"), "doctor", "--container"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Running as root - may break certain recipes" in done.stdout
    assert "export KAS_ALLOW_ROOT=yes" in done.stdout
    assert "Cannot connect to the Docker daemon" in done.stdout
    assert "sudo systemctl enable --now docker" in done.stdout
    assert "fix the FAIL lines" in done.stderr


def test_a_real_docker_client_without_its_daemon_is_a_blocker(tmp_path):
    """Where this host has the docker client but no daemon (as the build machines here do),
    the real client's own answer is what doctor reports."""
    docker = shutil.which("docker")
    if not docker:
        pytest.skip("needs_tool: docker (the client) is not installed")
    if subprocess.run([docker, "info"], capture_output=True, timeout=60).returncode == 0:
        pytest.skip("docker's daemon is running here: nothing to see")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").symlink_to(docker)
    facts = doctor.gather_facts(tmp_path, path_env=str(bin_dir), container=True, environ={})
    finding = by_check(doctor.judge(facts, container=True), "container engine")
    assert finding.status == FAIL and facts.engine_error in finding.detail


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
    assert by_check(no_engine, "container engine").status == FAIL


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
