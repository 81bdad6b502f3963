"""Access and security of the rendered image: no password-less login outside kas/debug.yml, SSH
keys or an expiring first password, DHCP on both NICs, hostname and serial console from the
config, and a scale-out fragment that does nothing when its variables are unset.

The bitbake-expansion test needs a bitbake checkout: set ROCKY_BITBAKE_DIR to one (branch 2.18);
without it that test skips."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rocky_vulkan.config import load_config
from rocky_vulkan.layer.manifest import render_files

IMAGE = "meta-rocky-vulkan/meta-rocky-vulkan/recipes-core/images/rocky-vulkan-image.bb"
INSECURE = ("empty-root-password", "allow-empty-password", "allow-root-login", "debug-tweaks")


def ed25519_line(comment: str, seed: int = 7) -> str:
    """A well-formed OpenSSH ed25519 public key line (type string + 32 bytes, as ssh-keygen
    writes them); the key itself is arbitrary."""
    blob = b"".join(len(p).to_bytes(4, "big") + p for p in (b"ssh-ed25519", bytes([seed]) * 32))
    return f"ssh-ed25519 {base64.b64encode(blob).decode()} {comment}"


KEY = ed25519_line("me@host")
# `openssl passwd -6 -salt saltsaltsalt test`: a hash of the form image.password_hash takes.
HASH = (
    "$6$saltsaltsalt$"
    "Eq7AXoCiNaawmn73OzHS/Onu63TphN5OQr60M2oXjFa5F.pQts/b39gupmlqDTIdMumDdbS9OVbuNRng/NNQ61"
)


def rendered(project: Path, edit: tuple[str, str] | None = None) -> dict[str, str]:
    path = project / "rocky-vulkan.yaml"
    if edit:
        text = path.read_text()
        assert edit[0] in text
        path.write_text(text.replace(edit[0], edit[1], 1))
    return {k: v.decode() for k, v in render_files(load_config(path)).items()}


def var(text: str, name: str) -> str:
    match = re.search("^" + name + r' [?]*= "((?:[^"\\]|\\.|\\\n)*)"', text, re.M)
    assert match, f"{name} not set"
    return match.group(1)


def test_only_the_debug_fragment_enables_password_less_logins(project):
    files = rendered(project)
    for path, text in files.items():
        body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        if path == "kas/debug.yml":
            assert "empty-root-password" in body and 'ROCKY_DEBUG_IMAGE = "1"' in body
            continue
        for feature in INSECURE:
            # The image recipe names them only in the guard that refuses them.
            allowed = path == IMAGE and feature != "debug-tweaks"
            occurrences = body.count(feature)
            assert occurrences == (1 if allowed else 0), (path, feature)
    image = files[IMAGE]
    assert var(image, "ROCKY_DEBUG_IMAGE") == "0"
    assert "rocky_refuse_insecure rocky_image_identity" in image
    assert 'bbfatal "${ROCKY_INSECURE_FOUND} in IMAGE_FEATURES outside kas/debug.yml' in image


def test_without_keys_or_hash_the_first_login_is_on_the_console(project):
    files = rendered(project)
    image = files[IMAGE]
    params = var(image, "EXTRA_USERS_PARAMS")
    # An empty password, expired: the first (console) login must set one.
    assert "useradd -m -s /bin/sh -G video -p '' ${ROCKY_USER};" in params
    assert "passwd-expire ${ROCKY_USER};" in params
    assert var(image, "ROCKY_SUDO_RULE") == "ALL=(ALL) ALL"
    assert var(image, "ROCKY_SSH_PASSWORDS") == "no"
    assert var(image, "ROCKY_CONSOLE_FIRST_LOGIN") == "1"
    # No password hash anywhere: nothing two images could share.
    for path, text in files.items():
        assert not re.search(r"\\?\$(1|5|6|y|2[aby])\\?\$", text), path


def test_a_password_hash_from_the_config_is_the_only_password(project):
    image = rendered(project, ("  password_hash: null", f"  password_hash: '{HASH}'"))[IMAGE]
    assert var(image, "ROCKY_PASSWORD_HASH") == HASH.replace("$", "\\$")
    params = var(image, "EXTRA_USERS_PARAMS")
    assert "-p '${ROCKY_PASSWORD_HASH}' ${ROCKY_USER};" in params and "passwd-expire" not in params
    assert var(image, "ROCKY_SUDO_RULE") == "ALL=(ALL) ALL"
    assert var(image, "ROCKY_SSH_PASSWORDS") == "yes"
    assert var(image, "ROCKY_CONSOLE_FIRST_LOGIN") == "0"


def test_with_keys_there_is_no_password_and_the_key_is_installed(project):
    image = rendered(project, ("  ssh_authorized_keys: []", f"  ssh_authorized_keys: ['{KEY}']"))[
        IMAGE
    ]
    params = var(image, "EXTRA_USERS_PARAMS")
    assert "-p '*' ${ROCKY_USER};" in params and "passwd-expire" not in params
    assert var(image, "ROCKY_SSH_KEYS") == f"'{KEY}'"
    assert var(image, "ROCKY_SUDO_RULE") == "ALL=(ALL) NOPASSWD: ALL"
    assert var(image, "ROCKY_SSH_PASSWORDS") == "no"
    assert "$home/.ssh/authorized_keys" in image


def test_hostname_user_and_network_come_from_the_config(project):
    image = rendered(project, ("    hostname: rock-5-itx", "    hostname: llm-box-7"))[IMAGE]
    # Each board its own name (by machine override); a machine not in the config: its name.
    assert var(image, "ROCKY_HOSTNAME") == "${MACHINE}"
    assert var(image, "ROCKY_HOSTNAME:rock-5-itx") == "llm-box-7"
    assert var(image, "ROCKY_HOSTNAME:rock-5b-rocky") == "rock-5b"
    assert "${sysconfdir}/hostname" in image
    network = image[image.index("rocky_image_network() {") :]
    assert "'[Match]' 'Name=en* eth*'" in network and "'DHCP=yes'" in network
    assert "10-rocky-dhcp.network" in network  # sorts before systemd-conf's 80-wired.network


def test_serial_console_is_ttys2_at_1500000(project):
    files = rendered(project)
    for machine in ("rock-5-itx", "rock-5b-rocky"):
        conf = files[f"meta-rocky-vulkan/meta-rocky-vulkan-bsp/conf/machine/{machine}.conf"]
        # meta-rockchip derives the kernel's console= (RK_CONSOLE_*) and the getty from this.
        assert 'SERIAL_CONSOLES = "1500000;ttyS2"' in conf


def test_scale_out_fragment_has_no_hard_coded_servers(project):
    kas = rendered(project)["kas/sstate-mirror.yml"]
    import yaml

    data = yaml.safe_load(kas)
    assert data["env"] == {
        "ROCKY_SSTATE_MIRROR": None,
        "BB_HASHSERVE_UPSTREAM": None,
        "ROCKY_PRSERV_HOST": None,
    }
    conf = data["local_conf_header"]["sstate-mirror"]
    assert "d.getVar('ROCKY_SSTATE_MIRROR')" in conf and "${ROCKY_" not in conf


@pytest.mark.slow
@pytest.mark.needs_bitbake
def test_bitbake_expands_the_guards_and_mirror_settings(project):
    bitbake = os.environ["ROCKY_BITBAKE_DIR"]
    sys.path.insert(0, str(Path(bitbake) / "lib"))
    import bb.data  # noqa: E402 - from the checkout named above
    import yaml

    files = rendered(project)
    image = files[IMAGE]
    conf = yaml.safe_load(files["kas/sstate-mirror.yml"])["local_conf_header"]["sstate-mirror"]
    mirror = var(conf.replace("SSTATE_MIRRORS:append", "SSTATE_MIRRORS"), "SSTATE_MIRRORS")
    prserv = var(conf, "PRSERV_HOST")
    for env, want_mirror, want_pr in (
        ({}, "", ""),
        (
            {"ROCKY_SSTATE_MIRROR": "https://s.example.org/w", "ROCKY_PRSERV_HOST": "pr:8585"},
            " file://.* https://s.example.org/w/PATH;downloadfilename=PATH",
            "pr:8585",
        ),
    ):
        d = bb.data.init()
        for k, v in env.items():
            d.setVar(k, v)
        d.setVar("SSTATE_MIRRORS", mirror)
        d.setVar("PRSERV_HOST", prserv)
        assert d.getVar("SSTATE_MIRRORS") == want_mirror
        assert d.getVar("PRSERV_HOST") == want_pr
    for features, found in (
        ("ssh-server-openssh", ""),
        (
            "ssh-server-openssh allow-root-login empty-root-password",
            "allow-root-login empty-root-password",
        ),
    ):
        d = bb.data.init()
        d.setVar("IMAGE_FEATURES", features)
        d.setVar("ROCKY_INSECURE_FEATURES", var(image, "ROCKY_INSECURE_FEATURES"))
        d.setVar("X", var(image, "ROCKY_INSECURE_FOUND"))
        assert d.getVar("X") == found


def _shell_function(text: str, name: str) -> str:
    start = re.search(rf"^{name} ?\(\) {{", text, re.M).start()
    return text[start : text.index("\n}\n", start) + 3]


def run_postprocess(image: str, rootfs: Path, **values: str) -> subprocess.CompletedProcess:
    """Run the recipe's rootfs post-process functions on a scratch rootfs, with bitbake's
    ${VAR} expansion done here from the recipe's own values (bitbake itself is not needed for
    these plain variables)."""
    names = ("ROCKY_USER", "ROCKY_SSH_KEYS", "ROCKY_SUDO_RULE")
    names += ("ROCKY_SSH_PASSWORDS", "ROCKY_CONSOLE_FIRST_LOGIN")
    known = {n: var(image, n) for n in names}
    # As bitbake resolves the machine override for MACHINE = "rock-5-itx".
    known["ROCKY_HOSTNAME"] = var(image, "ROCKY_HOSTNAME:rock-5-itx")
    known.update(IMAGE_ROOTFS=str(rootfs), sysconfdir="/etc", ROCKY_DEBUG_IMAGE="0")
    known.update(ROCKY_INSECURE_FOUND="", ROCKY_INSECURE_FEATURES="x", ROCKY_PAM="")
    known.update(values)
    # The order of the recipe's ROOTFS_POSTPROCESS_COMMAND.
    funcs = re.search(r'^ROOTFS_POSTPROCESS_COMMAND \+= "([^"]*)"', image, re.M).group(1).split()
    assert "rocky_image_sshd" in funcs
    script = 'bbfatal() { echo "FATAL: $*" >&2; exit 1; }\n'
    script += "".join(_shell_function(image, f) for f in funcs)
    script = re.sub(r"\$\{([A-Za-z_]+)\}", lambda m: known.get(m.group(1), m.group(0)), script)
    # bitbake runs shell functions with `set -e`; bash, as the build host's /bin/sh may be.
    script += "\nset -e\n" + "\n".join(funcs) + "\n"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True)


def scratch_rootfs(tmp_path: Path) -> Path:
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "home/rocky").mkdir(parents=True)
    uid = os.getuid()
    (rootfs / "etc/passwd").write_text(
        f"root:x:0:0::/root:/bin/sh\nrocky:x:{uid}:{os.getgid()}::/home/rocky:/bin/sh\n"
    )
    ssh = rootfs / "etc/ssh"
    (ssh / "sshd_config.d").mkdir(parents=True)
    for name in ("sshd_config", "sshd_config_readonly"):
        (ssh / name).write_text(OE_SSHD_CONFIG)
        (ssh / name).chmod(0o600)
    return rootfs


def test_postprocess_writes_hostname_sudo_rule_and_network(project, tmp_path):
    image = rendered(project)[IMAGE]
    rootfs = scratch_rootfs(tmp_path)
    proc = run_postprocess(image, rootfs)
    assert proc.returncode == 0, proc.stderr
    assert (rootfs / "etc/hostname").read_text() == "rock-5-itx\n"
    sudoers = rootfs / "etc/sudoers.d/10-rocky"
    assert sudoers.read_text() == "rocky ALL=(ALL) ALL\n"
    assert oct(sudoers.stat().st_mode & 0o777) == "0o440"
    assert not (rootfs / "home/rocky/.ssh").exists()
    network = (rootfs / "etc/systemd/network/10-rocky-dhcp.network").read_text()
    assert network == (
        "[Match]\nName=en* eth*\n\n[Network]\nDHCP=yes\nMulticastDNS=yes\n\n"
        "[DHCPv4]\nClientIdentifier=mac\n"
    )
    # mDNS needs resolved's global switch too (<hostname>.local answers on the LAN).
    mdns = rootfs / "etc/systemd/resolved.conf.d/10-rocky-mdns.conf"
    assert mdns.read_text() == "[Resolve]\nMulticastDNS=yes\n"


def test_postprocess_installs_every_configured_key(project, tmp_path):
    second = KEY.replace("me@host", "ci@runner")
    image = rendered(
        project, ("  ssh_authorized_keys: []", f"  ssh_authorized_keys: ['{KEY}', '{second}']")
    )[IMAGE]
    rootfs = scratch_rootfs(tmp_path)
    proc = run_postprocess(image, rootfs)
    assert proc.returncode == 0, proc.stderr
    keys = rootfs / "home/rocky/.ssh/authorized_keys"
    assert keys.read_text() == f"{KEY}\n{second}\n"
    assert oct(keys.stat().st_mode & 0o777) == "0o600"
    assert oct((rootfs / "home/rocky/.ssh").stat().st_mode & 0o777) == "0o700"
    assert (rootfs / "etc/sudoers.d/10-rocky").read_text() == "rocky ALL=(ALL) NOPASSWD: ALL\n"


def test_postprocess_refuses_password_less_features_outside_debug(project, tmp_path):
    image = rendered(project)[IMAGE]
    found = "allow-root-login empty-root-password"
    proc = run_postprocess(image, scratch_rootfs(tmp_path), ROCKY_INSECURE_FOUND=found)
    assert proc.returncode != 0
    assert f"FATAL: {found} in IMAGE_FEATURES outside kas/debug.yml" in proc.stderr
    debug = run_postprocess(
        image, scratch_rootfs(tmp_path / "d"), ROCKY_INSECURE_FOUND=found, ROCKY_DEBUG_IMAGE="1"
    )
    assert debug.returncode == 0, debug.stderr


# oe-core's sshd_config at the pinned commit (meta/recipes-connectivity/openssh/openssh/), cut to
# its active lines and the commented defaults of the settings that matter here, plus the HostKey
# line openssh_10.3p1.bb's sshd_hostkey_setup appends (PACKAGECONFIG hostkey-ecdsa).
OE_SSHD_CONFIG = """\
# This is the sshd server system-wide configuration file.  See
# sshd_config(5) for more information.
Include /etc/ssh/sshd_config.d/*.conf

#PermitRootLogin prohibit-password
#PubkeyAuthentication yes
AuthorizedKeysFile\t.ssh/authorized_keys

# To disable tunneled clear text passwords, change to no here!
#PasswordAuthentication yes
#PermitEmptyPasswords no

# Change to no to disable s/key passwords
KbdInteractiveAuthentication no
#UsePAM no
Compression no
ClientAliveInterval 15
ClientAliveCountMax 4

# override default of no subsystems
Subsystem\tsftp\t/usr/libexec/sftp-server
HostKey /etc/ssh/ssh_host_ecdsa_key
"""
# What an attacker-friendly starting point looks like: oe-core's allow-root-login and
# allow-empty-password edits, mixed case, '=' syntax, a drop-in and a Match block.
PERMISSIVE_SSHD_CONFIG = """\
Include /etc/ssh/sshd_config.d/*.conf
PermitRootLogin yes
passwordauthentication=yes
  PermitEmptyPasswords yes
KbdInteractiveAuthentication yes
Subsystem\tsftp\t/usr/libexec/sftp-server
Match User rocky
\tPasswordAuthentication yes
"""
SSHD_DEFAULTS = {  # OpenSSH's built-in defaults for the settings checked
    "permitrootlogin": "prohibit-password",
    "permitemptypasswords": "no",
    "passwordauthentication": "yes",
    "kbdinteractiveauthentication": "yes",
    "pubkeyauthentication": "yes",
}


def effective_sshd(rootfs: Path, name: str = "sshd_config") -> dict[str, str]:
    """The global value of each keyword as sshd reads it: the first one wins, Include'd files
    are read where the Include stands, Match blocks apply to matching connections only."""
    seen: dict[str, str] = {}

    def read(path: Path, top: bool) -> None:
        for raw in path.read_text().splitlines():
            text = raw.strip()
            if not text or text.startswith("#"):
                continue
            key, value = re.split(r"\s*=\s*|\s+", text, maxsplit=1)
            key = key.lower()
            if key == "match":
                if top:
                    return  # the rest of the file is conditional
                continue
            if key == "include":
                for pattern in value.split():
                    for inc in sorted(
                        (rootfs / pattern.lstrip("/")).parent.glob(Path(pattern).name)
                    ):
                        read(inc, False)
                continue
            seen.setdefault(key, value)

    read(rootfs / "etc/ssh" / name, True)
    return {**SSHD_DEFAULTS, **seen}


ACCESS_CASES = {
    "console-first-login": (None, "no", ""),
    "keys": (("  ssh_authorized_keys: []", f"  ssh_authorized_keys: ['{KEY}']"), "no", KEY),
    "password-hash": (
        ("  password_hash: null", f"  password_hash: '{HASH}'"),
        "yes",
        "",
    ),
}


@pytest.mark.parametrize("case", ACCESS_CASES, ids=str)
@pytest.mark.parametrize("stock", ["oe", "permissive"])
def test_sshd_after_postprocess_takes_no_root_no_empty_and_passwords_only_with_a_hash(
    project, tmp_path, case, stock
):
    edit, passwords, key = ACCESS_CASES[case]
    image = rendered(project, edit)[IMAGE]
    rootfs = scratch_rootfs(tmp_path)
    if stock == "permissive":
        for name in ("sshd_config", "sshd_config_readonly"):
            (rootfs / "etc/ssh" / name).write_text(PERMISSIVE_SSHD_CONFIG)
        (rootfs / "etc/ssh/sshd_config.d/50-x.conf").write_text("PasswordAuthentication yes\n")
    proc = run_postprocess(image, rootfs)
    assert proc.returncode == 0, proc.stderr
    for name in ("sshd_config", "sshd_config_readonly"):
        got = effective_sshd(rootfs, name)
        assert got["permitrootlogin"] == "no"
        assert got["permitemptypasswords"] == "no"
        assert got["passwordauthentication"] == passwords
        assert got["kbdinteractiveauthentication"] == "no"
        assert got["pubkeyauthentication"] == "yes"
        assert got["allowusers"] == "rocky"
        text = (rootfs / "etc/ssh" / name).read_text()
        assert not re.search(r"(?im)^\s*match\s.*\n(\s+.*\n)*\s*passwordauthentication\s*yes", text)
        assert "Subsystem\tsftp\t/usr/libexec/sftp-server" in text  # the rest is kept
        assert oct((rootfs / "etc/ssh" / name).stat().st_mode & 0o777) == "0o600"
    keys = rootfs / "home/rocky/.ssh/authorized_keys"
    assert (keys.read_text() if keys.exists() else "") == (f"{key}\n" if key else "")


def test_debug_image_keeps_oe_core_sshd_edits(project, tmp_path):
    image = rendered(project)[IMAGE]
    rootfs = scratch_rootfs(tmp_path)
    for name in ("sshd_config", "sshd_config_readonly"):
        (rootfs / "etc/ssh" / name).write_text(PERMISSIVE_SSHD_CONFIG)
    found = "allow-empty-password allow-root-login empty-root-password"
    proc = run_postprocess(image, rootfs, ROCKY_DEBUG_IMAGE="1", ROCKY_INSECURE_FOUND=found)
    assert proc.returncode == 0, proc.stderr
    assert (rootfs / "etc/ssh/sshd_config").read_text() == PERMISSIVE_SSHD_CONFIG


def test_pam_with_no_keys_and_no_hash_stops_the_build(project, tmp_path):
    # With PAM, oe-core's common-auth refuses the empty first password: nobody could log in.
    image = rendered(project)[IMAGE]
    proc = run_postprocess(image, scratch_rootfs(tmp_path), ROCKY_PAM="pam")
    assert proc.returncode != 0
    assert "FATAL: pam is in DISTRO_FEATURES" in proc.stderr
    assert "image.password_hash" in proc.stderr
    keyed = rendered(project, ACCESS_CASES["keys"][0])[IMAGE]
    proc = run_postprocess(keyed, scratch_rootfs(tmp_path / "k"), ROCKY_PAM="pam")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.needs_sshd
@pytest.mark.parametrize("case", ACCESS_CASES, ids=str)
def test_real_sshd_reads_the_postprocessed_config_the_same_way(project, tmp_path, case):
    """`sshd -T` (OpenSSH's own parser) on the post-processed config. Needs ROCKY_SSHD: a
    command that runs an sshd binary, e.g. Debian's from `apt-get download openssh-server`
    (docs/verification/config-access.md shows the command); skipped without it."""
    sshd = os.environ["ROCKY_SSHD"]
    edit, passwords, _ = ACCESS_CASES[case]
    image = rendered(project, edit)[IMAGE]
    rootfs = scratch_rootfs(tmp_path)
    assert run_postprocess(image, rootfs).returncode == 0
    config = rootfs / "etc/ssh/sshd_config"
    # Point the Include at the scratch rootfs, and give sshd a host key to start with.
    config.write_text(config.read_text().replace("/etc/ssh/", f"{rootfs}/etc/ssh/"))
    hostkey = tmp_path / "hostkey"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", hostkey], check=True)
    argv = [*sshd.split(), "-T", "-f", config, "-o", f"HostKey={hostkey}"]
    got = {}
    for user in ("rocky", "root"):
        out = subprocess.run(
            [*map(str, argv), "-C", f"user={user},host=h,addr=192.0.2.1"],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr
        got[user] = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    for user in ("rocky", "root"):
        assert got[user]["permitrootlogin"] == "no"
        assert got[user]["permitemptypasswords"] == "no"
        assert got[user]["passwordauthentication"] == passwords
        assert got[user]["kbdinteractiveauthentication"] == "no"
        assert got[user]["allowusers"] == "rocky"


@pytest.mark.slow
@pytest.mark.needs_bitbake
@pytest.mark.needs_oecore
@pytest.mark.needs_root
@pytest.mark.needs_tool("useradd", "Debian: passwd")
@pytest.mark.parametrize("case", ACCESS_CASES, ids=str)
def test_extrausers_creates_the_user_with_the_configured_password(project, tmp_path, case):
    """The rendered EXTRA_USERS_PARAMS, expanded by bitbake's data store, run through oe-core's
    own extrausers/useradd_base shell functions and the host's real `useradd -R` (as root).
    Needs ROCKY_BITBAKE_DIR (bitbake 2.18) and ROCKY_OECORE_DIR (openembedded-core at the pin)."""
    bitbake, oecore = os.environ["ROCKY_BITBAKE_DIR"], os.environ["ROCKY_OECORE_DIR"]
    sys.path.insert(0, str(Path(bitbake) / "lib"))
    import bb.data  # noqa: E402 - from the checkout named above

    edit, _, _ = ACCESS_CASES[case]
    image = rendered(project, edit)[IMAGE]
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "home").mkdir()
    (rootfs / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    (rootfs / "etc/shadow").write_text("root:*:1::::::\n")
    (rootfs / "etc/group").write_text("root:x:0:\nvideo:x:44:\n")
    (rootfs / "etc/gshadow").write_text("root:*::\nvideo:*::\n")
    pseudo = tmp_path / "native/usr/bin/pseudo"  # pseudo's place; as root, run the command as is
    pseudo.parent.mkdir(parents=True)
    pseudo.write_text('#!/bin/sh\nexec "$@"\n')
    pseudo.chmod(0o755)
    classes = Path(oecore) / "meta/classes"
    script = _shell_function((classes / "extrausers.bbclass").read_text(), "set_user_group")
    base = (classes / "useradd_base.bbclass").read_text()
    script += _shell_function(base, "perform_useradd") + _shell_function(
        base, "perform_passwd_expire"
    )
    d = bb.data.init()
    for name in ("ROCKY_USER", "ROCKY_PASSWORD_HASH", "EXTRA_USERS_PARAMS"):
        if re.search(f"^{name} = ", image, re.M):
            d.setVar(name, var(image, name).replace("\\\n", " "))
    for name, value in dict(
        IMAGE_ROOTFS=str(rootfs),
        sysconfdir="/etc",
        PN="rocky-vulkan-image",
        FAKEROOTENV="",
        STAGING_DIR_NATIVE=str(tmp_path / "native"),
        bindir="/usr/bin",
        SCRIPT=script,
    ).items():
        d.setVar(name, value)
    helpers = 'bbnote() { :; }\nbbwarn() { :; }\nbbfatal() { echo "FATAL: $*" >&2; exit 1; }\n'
    proc = subprocess.run(
        ["bash", "-c", helpers + d.getVar("SCRIPT") + "\nset -e\nset_user_group\n"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shadow = dict(
        (line.split(":")[0], line.split(":"))
        for line in (rootfs / "etc/shadow").read_text().splitlines()
    )
    password, lastchg = shadow["rocky"][1], shadow["rocky"][2]
    if case == "console-first-login":
        assert (password, lastchg) == ("", "0")  # empty and expired: set at the first login
    elif case == "keys":
        assert password == "*" and lastchg != "0"
    else:
        assert password == HASH and lastchg != "0"
    assert "rocky" in (rootfs / "etc/group").read_text().split("video:x:44:")[1]
