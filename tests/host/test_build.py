"""build: the kas command line, the environment, the image search, and the translation of known
failures. The failures come from the real kas 5.5 run offline where it can produce them (an
unresolvable host, a project without oe-core, an unpinned repo) and from captured output
(tests/fixtures/kas-output/) where it needs a full checkout (bitbake missing next to oe-core)
or a running bitbake (a fetch failing)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rocky_vulkan.cli import main
from rocky_vulkan.config import ConfigError, load_config
from rocky_vulkan.errors import UserError
from rocky_vulkan.host import build, buildlog

from tests.helpers import hostile, project

FIXTURES = project.FIXTURES / "kas-output"
LICENCE = ("--fragment", "model-licence")


def run_build(project: Path, *args: str) -> int:
    """`rocky-vulkan --config PROJECT/rocky-vulkan.yaml build ARGS` in this process."""
    return main(["--config", str(project / "rocky-vulkan.yaml"), "build", *args])


KAS = str(Path(sys.executable).with_name("kas"))


def keys(lines: list[str]) -> list[str]:
    return [d.key for d in buildlog.diagnose(lines)]


def test_config_arg_joins_machine_and_fragments(project):
    cfg = load_config(project / "rocky-vulkan.yaml")
    assert build.kas_config_arg(cfg, "rock-5-itx", []) == "kas/rock-5-itx.yml"
    assert (
        build.kas_config_arg(cfg, "rock-5b-rocky", ["debug", "sstate-mirror"])
        == "kas/rock-5b-rocky.yml:kas/debug.yml:kas/sstate-mirror.yml"
    )
    assert build.available_fragments(cfg) == [
        "debug",
        "model-licence",
        "offline",
        "sstate-mirror",
        "vulkan-cts",
    ]
    with pytest.raises(UserError, match="unknown fragment 'fast'.*debug, model-licence, offline"):
        build.kas_config_arg(cfg, "rock-5-itx", ["fast"])
    with pytest.raises(ConfigError, match="unknown machine 'rock-9'"):
        build.kas_config_arg(cfg, "rock-9", [])


def test_kas_container_gets_the_mirror_settings_forwarded():
    env = {"ROCKY_SSTATE_MIRROR": "https://s.example.org/w", "PATH": "/usr/bin"}
    assert build.kas_command("kas", "kas/a.yml", False, env) == ["kas", "build", "kas/a.yml"]
    assert build.kas_command("kas-container", "kas/a.yml", True, env) == [
        "kas-container",
        "--runtime-args",
        "-e ROCKY_SSTATE_MIRROR",
        "build",
        "kas/a.yml",
    ]
    assert build.kas_command("kas-container", "kas/a.yml", True, {}) == [
        "kas-container",
        "build",
        "kas/a.yml",
    ]


def test_download_and_sstate_dirs_default_outside_the_repo(tmp_path):
    env = build.build_environment({"HOME": str(tmp_path), "PATH": "/usr/bin"})
    assert env["DL_DIR"] == str(tmp_path / ".cache/rocky-vulkan/downloads")
    assert env["SSTATE_DIR"] == str(tmp_path / ".cache/rocky-vulkan/sstate-cache")
    given = build.build_environment(
        {"HOME": str(tmp_path), "DL_DIR": "/srv/dl", "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    )
    assert given["DL_DIR"] == "/srv/dl"
    assert given["SSTATE_DIR"] == str(tmp_path / "xdg/rocky-vulkan/sstate-cache")


def test_find_images_prefers_the_stable_symlink_and_needs_the_bmap(tmp_path):
    deploy = tmp_path / "tmp/deploy/images/rock-5-itx"
    deploy.mkdir(parents=True)
    stamped = deploy / "rocky-vulkan-image-rock-5-itx.rootfs-20261202.wic.gz"
    stamped.write_bytes(b"x")
    assert build.find_images(tmp_path, "rock-5-itx") is None  # no .bmap yet
    (deploy / "rocky-vulkan-image-rock-5-itx.rootfs-20261202.wic.bmap").write_text("<bmap/>")
    link = deploy / "rocky-vulkan-image-rock-5-itx.rootfs.wic.gz"
    link.symlink_to(stamped.name)
    (deploy / "rocky-vulkan-image-rock-5-itx.rootfs.wic.bmap").symlink_to(
        "rocky-vulkan-image-rock-5-itx.rootfs-20261202.wic.bmap"
    )
    images = build.find_images(tmp_path, "rock-5-itx")
    assert images.wic == link
    assert images.bmap.name == "rocky-vulkan-image-rock-5-itx.rootfs.wic.bmap"
    assert build.find_images(tmp_path, "rock-5b-rocky") is None


def test_progress_lines():
    p = buildlog.parse_progress(
        "NOTE: Running task 12 of 3456 (/w/openembedded-core/meta/recipes-core/zlib/"
        "zlib_1.3.1.bb:do_compile)"
    )
    assert (p.done, p.total, p.task, p.setscene) == (12, 3456, "zlib_1.3.1.bb:do_compile", False)
    s = buildlog.parse_progress(
        "NOTE: Running setscene task 5 of 900 (/x/y.bb:do_populate_sysroot_setscene)"
    )
    assert s.setscene and s.total == 900
    assert buildlog.parse_progress("NOTE: Running noexec task 7 of 10 (/x/y.bb:do_build)").done == 7
    assert buildlog.parse_progress("NOTE: recipe zlib: task do_fetch: Started") is None


def _kas_project(tmp_path: Path, repos: str) -> Path:
    layers = tmp_path / "layers"
    (layers / "meta-x/conf").mkdir(parents=True)
    (layers / "meta-x/conf/layer.conf").write_text('BBPATH .= ":${LAYERDIR}"\n')
    git = ["git", "-c", "user.email=t@example.org", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", "-b", "master", str(layers)], check=True)
    subprocess.run([*git, "-C", str(layers), "add", "."], check=True)
    subprocess.run([*git, "-C", str(layers), "commit", "-qm", "init"], check=True)
    proj = tmp_path / "proj"
    (proj / "kas").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(proj)], check=True)
    (proj / "kas/t.yml").write_text(
        "header:\n  version: 23\nmachine: qemuarm64\nrepos:\n"
        f"  layers:\n    url: file://{layers}\n    branch: master\n    layers:\n      meta-x:\n"
        + repos
    )
    return proj


def _real_kas(proj: Path) -> tuple[int, list[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAS_")}
    proc = subprocess.run(
        [KAS, "build", "kas/t.yml"], cwd=proj, env=env, capture_output=True, text=True, timeout=120
    )
    return proc.returncode, (proc.stdout + proc.stderr).splitlines()


def test_real_kas_network_down_and_unpinned_repo(tmp_path):
    # .invalid never resolves (RFC 2606): the same failure as a dead network, on demand.
    proj = _kas_project(
        tmp_path,
        "  bitbake:\n    url: https://git.openembedded.org.invalid/bitbake\n"
        '    branch: "2.18"\n    layers:\n      bitbake: disabled\n',
    )
    rc, lines = _real_kas(proj)
    assert rc != 0
    found = buildlog.diagnose(lines)
    assert [d.key for d in found] == ["unpinned-repo", "network-clone"]
    assert "'layers' is not pinned" in found[0].cause
    assert "git.openembedded.org.invalid" in found[1].cause
    assert "--fragment offline" in found[1].fix and ":kas/offline.yml" in found[1].fix
    assert "KAS_PREMIRRORS" in found[1].fix


def test_real_kas_project_without_oe_core(tmp_path):
    rc, lines = _real_kas(_kas_project(tmp_path, ""))
    assert rc != 0
    assert "missing-oe-core" in keys(lines)


def test_captured_missing_bitbake_and_fetch_failure():
    bitbake = buildlog.diagnose((FIXTURES / "missing-bitbake.log").read_text().splitlines())
    assert [d.key for d in bitbake] == ["missing-bitbake"]
    assert "(/tmp/up-kas/bitbake)" in bitbake[0].cause
    assert "branch 2.18" in bitbake[0].fix
    fetch = keys((FIXTURES / "bitbake-fetch-offline.log").read_text().splitlines())
    assert fetch == ["network-fetch"]


@pytest.mark.parametrize(
    ("line", "key"),
    [
        (
            "ERROR:  OE-core's config sanity checker detected ... Do not use Bitbake as root.",
            "root",
        ),
        ("ERROR: User namespaces are not usable by BitBake, possibly due to AppArmor.", "userns"),
        ("    Your system needs to support the en_US.UTF-8 locale.", "locale"),
        (
            "ERROR: No new tasks can be executed since the disk space monitor action is "
            '"STOPTASKS"!',
            "disk-full",
        ),
        (
            "ERROR: Network access disabled through BB_NO_NETWORK (or set indirectly",
            "no-network-allowed",
        ),
        ("NOTE: Tasks Summary: Attempted 10 tasks of which 0 didn't need to be rerun", None),
    ],
)
def test_bitbake_sanity_messages(line, key):
    # The message texts are oe-core's sanity.bbclass / bitbake's monitordisk.py and fetch2 at
    # the pinned commits.
    assert keys([line]) == ([key] if key else [])


def _fake_kas(bin_dir: Path, record: Path, output: Path, rc: int) -> None:
    """Fault injection: a `kas` that replays captured kas output and fails, recording how it
    was called (one JSON line per call). The real kas cannot fail this way without a full
    oe-core checkout."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "kas"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"call = {{'argv': sys.argv[1:], 'cwd': os.getcwd(), 'DL_DIR': os.environ.get('DL_DIR'),"
        f" 'SSTATE_DIR': os.environ.get('SSTATE_DIR')}}\n"
        f"open({str(record)!r}, 'a').write(json.dumps(call) + '\\n')\n"
        f"sys.stdout.write(open({str(output)!r}).read())\n"
        f"sys.exit({rc})\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def calls(record: Path) -> list[dict]:
    return [json.loads(line) for line in record.read_text().splitlines()]


def test_cli_build_runs_kas_with_joined_files_and_translates_the_failure(
    project, tmp_path, monkeypatch, capsys
):
    record = tmp_path / "kas-call.json"
    _fake_kas(tmp_path / "bin", record, FIXTURES / "missing-bitbake.log", rc=2)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DL_DIR", raising=False)
    monkeypatch.setenv("SSTATE_DIR", str(tmp_path / "sstate"))
    monkeypatch.delenv("KAS_BUILD_DIR", raising=False)
    rc = main(
        ["--config", str(project / "rocky-vulkan.yaml"), "build", "--skip-doctor"]
        + ["--fragment", "model-licence", "--fragment", "debug", "--machine", "rock-5b-rocky"]
    )
    assert rc == UserError.exit_code
    (call,) = calls(record)
    assert call["argv"] == ["build", "kas/rock-5b-rocky.yml:kas/model-licence.yml:kas/debug.yml"]
    assert Path(call["cwd"]) == project
    assert call["DL_DIR"] == str(tmp_path / "home/.cache/rocky-vulkan/downloads")
    assert call["SSTATE_DIR"] == str(tmp_path / "sstate")
    err = capsys.readouterr().err
    assert "no bitbake checkout" in err and "fix: add the `bitbake` repo" in err
    assert "kas build failed with exit 2" in err
    log = (project / "build" / build.LOG_NAME).read_text()
    assert "The bitbake directory (/tmp/up-kas/bitbake) does not exist" in log


def test_cli_build_success_without_an_image_is_an_error(project, tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty.log"
    empty.write_text("NOTE: Tasks Summary: Attempted 1 tasks of which 1 didn't need to be rerun\n")
    _fake_kas(tmp_path / "bin", tmp_path / "call.json", empty, rc=0)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    rc = run_build(project, "--skip-doctor", *LICENCE)
    assert rc == UserError.exit_code
    assert "no rocky-vulkan-image-rock-5-itx*.wic.gz" in capsys.readouterr().err


def test_cli_build_stops_before_kas_when_doctor_fails(project, tmp_path, monkeypatch, capsys):
    record = tmp_path / "call.json"
    _fake_kas(tmp_path / "bin", record, FIXTURES / "missing-bitbake.log", rc=2)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # a host with kas and nothing else
    t0 = time.monotonic()
    rc = run_build(project, *LICENCE)
    assert rc == UserError.exit_code
    assert "build host is not ready" in capsys.readouterr().err
    assert [c["argv"] for c in calls(record)] == [["--version"]]  # doctor asked, no build
    assert time.monotonic() - t0 < 60


def test_build_without_the_model_licence_stops_before_kas(project, tmp_path, monkeypatch, capsys):
    record = tmp_path / "call.json"
    _fake_kas(tmp_path / "bin", record, FIXTURES / "missing-bitbake.log", rc=2)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert run_build(project, "--skip-doctor", "--fragment", "debug") == UserError.exit_code
    err = capsys.readouterr().err
    assert "add --fragment model-licence" in err
    assert "https://huggingface.co/Qwen/Qwen2.5-3B-Instruct-GGUF/blob/" in err  # where to read it
    assert not record.exists()  # kas never ran


def test_no_login_is_said_before_the_build_and_a_key_gives_the_ssh_line(
    project, tmp_path, monkeypatch, capsys
):
    empty = tmp_path / "ok.log"
    empty.write_text("NOTE: Tasks Summary: Attempted 1 tasks of which 1 didn't need to be rerun\n")
    _fake_kas(tmp_path / "bin", tmp_path / "call.json", empty, rc=0)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    deploy = project / "build/tmp/deploy/images/rock-5-itx"
    deploy.mkdir(parents=True)
    (deploy / "rocky-vulkan-image-rock-5-itx.rootfs.wic.gz").write_bytes(b"x")
    (deploy / "rocky-vulkan-image-rock-5-itx.rootfs.wic.bmap").write_text("<bmap/>")
    assert run_build(project, "--skip-doctor", *LICENCE) == 0
    out = capsys.readouterr()
    assert "no SSH key and no password hash" in out.err and "--ssh-key" in out.err
    assert "login: serial console or HDMI only" in out.out
    pub = tmp_path / "me.pub"
    pub.write_text(hostile._ssh_key("me@laptop") + "\n")
    assert run_build(project, "--skip-doctor", *LICENCE, "--ssh-key", str(pub)) == 0
    out = capsys.readouterr()
    assert "no SSH key" not in out.err
    assert "login: ssh rocky@rock-5-itx.local   (1 key in image.ssh_authorized_keys)" in out.out


def test_downloads_of_a_plain_kas_build_are_named_with_how_to_reuse_them(tmp_path):
    build_dir = tmp_path / "build"
    (build_dir / "downloads").mkdir(parents=True)
    (build_dir / "downloads/zlib-1.3.1.tar.xz").write_bytes(b"x")
    (build_dir / "sstate-cache").mkdir()  # empty: nothing to say
    env = build.build_environment({"HOME": str(tmp_path / "home")})
    (note,) = build.stray_caches(build_dir, env)
    assert f"{build_dir / 'downloads'} holds what a plain `kas build` put there" in note
    assert f"export DL_DIR={build_dir / 'downloads'}" in note
    assert str(tmp_path / "home/.cache/rocky-vulkan/downloads") in note
    same = build.build_environment({"HOME": "/h", "DL_DIR": str(build_dir / "downloads")})
    assert build.stray_caches(build_dir, same) == []  # that is the DL_DIR in use


def test_offline_build_needs_the_layer_repos_or_premirrors_and_a_filled_dl_dir(
    project, tmp_path, monkeypatch, capsys
):
    record = tmp_path / "call.json"
    _fake_kas(tmp_path / "bin", record, FIXTURES / "bitbake-fetch-offline.log", rc=1)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KAS_PREMIRRORS", raising=False)
    monkeypatch.delenv("KAS_WORK_DIR", raising=False)
    monkeypatch.delenv("DL_DIR", raising=False)
    offline = ("--skip-doctor", *LICENCE, "--fragment", "offline")
    assert run_build(project, *offline) == UserError.exit_code
    err = capsys.readouterr().err
    assert "bitbake, openembedded-core, meta-yocto, meta-arm, meta-rockchip are not in" in err
    assert "KAS_PREMIRRORS is not set" in err and "DL_DIR" in err and "is empty" in err
    assert not record.exists()
    dl = tmp_path / "home/.cache/rocky-vulkan/downloads"
    dl.mkdir(parents=True, exist_ok=True)
    (dl / "zlib-1.3.1.tar.xz").write_bytes(b"x")
    monkeypatch.setenv("KAS_PREMIRRORS", r"^https://([^/]+)/ file:///srv/mirrors/\1/")
    assert run_build(project, *offline) == UserError.exit_code  # kas ran (and failed: the fake)
    assert calls(record)[0]["argv"] == [
        "build",
        "kas/rock-5-itx.yml:kas/model-licence.yml:kas/offline.yml",
    ]


def test_the_documented_premirror_maps_every_layer_repo_to_a_local_folder(monkeypatch):
    """The KAS_PREMIRRORS line of docs/user/build.md, applied by kas 5.5's own code to every
    repo of the config."""
    from kas.repos import Repo

    doc = (project.ROOT / "docs/user/build.md").read_text()
    (line,) = [x for x in doc.splitlines() if x.startswith("export KAS_PREMIRRORS=")]
    value = line.split("=", 1)[1].strip("'")
    home = "/home/me"
    monkeypatch.setenv("KAS_PREMIRRORS", value.replace("$HOME", home).replace('"', ""))
    for repo in load_config(project.ROOT / "rocky-vulkan.yaml").repos:
        url = Repo.effective_url.fget(type("R", (), {"url": repo.url})())
        host_path = repo.url.split("://", 1)[1]
        assert url == f"file://{home}/mirrors/{host_path}", repo.name


def test_real_kas_clones_through_a_premirror_without_network(tmp_path):
    """What the offline advice rests on: with KAS_PREMIRRORS, kas 5.5 clones a layer whose URL
    cannot resolve (.invalid) from a local mirror; without it the same checkout needs the
    network. (The project has no oe-core, so kas stops after the clone: that is later.)"""
    proj = _kas_project(tmp_path, "")
    kas_file = proj / "kas/t.yml"
    layers = tmp_path / "layers"
    mirror = tmp_path / "mirrors/git.example.invalid/layers"
    subprocess.run(["git", "clone", "-q", "--mirror", str(layers), str(mirror)], check=True)
    kas_file.write_text(
        kas_file.read_text().replace(f"file://{layers}", "https://git.example.invalid/layers")
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAS_")}

    def checkout(**extra: str) -> list[str]:
        done = subprocess.run(
            [KAS, "checkout", "kas/t.yml"],
            cwd=proj,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
        )
        return (done.stdout + done.stderr).splitlines()

    lines = checkout(KAS_PREMIRRORS=rf"^https://([^/]+)/ file://{tmp_path}/mirrors/\1/")
    assert any("Repository layers checked out to" in x for x in lines), lines
    assert (proj / "layers/meta-x/conf/layer.conf").is_file()
    shutil.rmtree(proj / "layers")
    lines = checkout()
    assert not (proj / "layers/meta-x").exists()
    assert "network-clone" in keys(lines)


@pytest.mark.parametrize(
    ("line", "key", "fix"),
    [
        # kas-container 5.5's fatal_error texts, and docker's / podman's own.
        (
            "kas-container: Error: Running as root - may break certain recipes. Better give a",
            "container-root",
            "KAS_ALLOW_ROOT=yes",
        ),
        (
            "docker: Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
            "Is the docker daemon running?",
            "docker-down",
            "systemctl enable --now docker",
        ),
        (
            "docker: permission denied while trying to connect to the Docker daemon socket at "
            "unix:///var/run/docker.sock: Head ...",
            "docker-permission",
            "usermod -aG docker",
        ),
        (
            "kas-container: Error: no container engine found, need docker or podman",
            "no-engine",
            "podman",
        ),
        (
            'kas-container: Error: Variable DL_DIR set, but "/x" is not a directory.',
            "kas-container",
            "do what it says",
        ),
    ],
)
def test_container_messages(line, key, fix):
    (found,) = buildlog.diagnose([line])
    assert (found.key, fix in found.fix) == (key, True)


def _fake_engine(bin_dir: Path) -> None:
    """Fault injection: a `docker` that answers like the real client whose daemon is stopped
    (docker 28's texts, seen on a host with the client and no daemon). No real engine can be
    stopped on demand in a test."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "docker"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        '  -v) echo "Docker version 28.2.2, build e6534b4" ;;\n'
        "  context) echo default ;;\n"
        "  *) echo 'Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
        "Is the docker daemon running?' >&2; exit 1 ;;\n"
        "esac\n"
    )
    script.chmod(0o755)


def _as_root() -> list[str]:
    """A prefix that runs a command with uid 0: nothing as root, else a user namespace."""
    if os.geteuid() == 0:
        return []
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-r", "true"], capture_output=True).returncode == 0:
        return [unshare, "-r"]
    pytest.skip("needs root or unprivileged user namespaces (unshare -r)")


def _cli(project: Path, prefix: list[str], env: dict[str, str], *args: str):
    return subprocess.run(
        [*prefix, sys.executable, "-m", "rocky_vulkan.cli", "--config"]
        + [str(project / "rocky-vulkan.yaml"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_build_container_shows_kas_containers_own_error(project, tmp_path):
    """The real kas-container (kas 5.5's script) as root, then with KAS_ALLOW_ROOT=yes against a
    docker whose daemon is stopped: each failure is named with its fix, never 'no known cause'."""
    _fake_engine(tmp_path / "bin")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAS_", "DL_", "SSTATE_"))}
    env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}"
    env["PATH"] += os.environ["PATH"]
    env["HOME"] = str(tmp_path / "home")
    subprocess.run(["git", "init", "-q", str(project)], check=True)  # kas-container wants a repo
    build_args = ("build", "--container", "--skip-doctor", *LICENCE)
    root = _cli(project, _as_root(), env, *build_args)
    assert root.returncode == UserError.exit_code, root.stderr
    assert "kas-container refuses to run as root" in root.stderr
    assert "KAS_ALLOW_ROOT=yes" in root.stderr
    assert "no known cause" not in root.stderr
    down = _cli(project, _as_root(), {**env, "KAS_ALLOW_ROOT": "yes"}, *build_args)
    assert "docker's daemon is not running (unix:///var/run/docker.sock)" in down.stderr
    assert "systemctl enable --now docker" in down.stderr
    assert "no known cause" not in down.stderr


def test_an_unknown_failure_shows_the_last_lines(project, tmp_path, monkeypatch, capsys):
    odd = tmp_path / "odd.log"
    odd.write_text("starting\nsomething nobody has seen before\n\n")
    _fake_kas(tmp_path / "bin", tmp_path / "call.json", odd, rc=3)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert run_build(project, "--skip-doctor", *LICENCE) == UserError.exit_code
    err = capsys.readouterr().err
    assert "kas build failed with exit 3; no known cause recognised, its last lines:" in err
    assert "    starting\n    something nobody has seen before\n" in err
