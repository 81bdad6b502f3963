"""`rocky-vulkan build --ssh-key FILE`: real public keys from ssh-keygen go into
image.ssh_authorized_keys with every comment and line of rocky-vulkan.yaml kept; every hostile
file (a private key, two lines, control characters, a huge file, a FIFO, a device, ...) is
refused with its cause and fix, nothing of it is echoed, and the config is left byte for byte as
it was, with no temp file beside it."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from rocky_vulkan.cli import main
from rocky_vulkan.config import load_config
from rocky_vulkan.errors import UserError
from rocky_vulkan.host import sshkey

from tests.helpers.hostile import _ssh_key

needs_keygen = pytest.mark.needs_tool("ssh-keygen", "Debian: openssh-client")


def keygen(tmp_path: Path, kind: str = "ed25519", comment: str = "me@laptop") -> Path:
    """A real key pair from OpenSSH's ssh-keygen; returns the private key's path."""
    key = tmp_path / f"id_{kind}_{comment.replace('@', '_').replace(' ', '_')}"
    extra = ["-b", "2048"] if kind == "rsa" else []
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, *extra, "-N", "", "-C", comment, "-f", str(key)],
        check=True,
        capture_output=True,
    )
    return key


@pytest.fixture(autouse=True)
def kas_stub(tmp_path, monkeypatch) -> Path:
    """Fault injection: a `kas` that records its call and fails at once, so a build that got
    past the key step, the render and lint stops there (a real kas would clone for minutes)."""
    bin_dir = tmp_path / "stub-bin"
    bin_dir.mkdir()
    record = tmp_path / "kas-calls"
    script = bin_dir / "kas"
    script.write_text(f'#!/bin/sh\necho "$@" >> {record}\necho stub kas stops here\nexit 1\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DL_DIR", raising=False)
    monkeypatch.delenv("SSTATE_DIR", raising=False)
    return record


def build_with_keys(project: Path, *files: str | Path) -> int:
    """`rocky-vulkan build --fragment model-licence --ssh-key ...` on the project copy."""
    argv = ["--config", str(project / "rocky-vulkan.yaml"), "build", "--skip-doctor"]
    argv += ["--fragment", "model-licence"]
    for f in files:
        argv += ["--ssh-key", str(f)]
    return main(argv)


def snapshot(project: Path) -> tuple[bytes, list[str]]:
    return (project / "rocky-vulkan.yaml").read_bytes(), sorted(os.listdir(project))


# ---- good keys -------------------------------------------------------------------------------


@needs_keygen
def test_a_real_public_key_is_added_and_rendered_and_comments_are_kept(project, tmp_path, capsys):
    before = (project / "rocky-vulkan.yaml").read_text()
    pub = Path(f"{keygen(tmp_path)}.pub")
    line = pub.read_text().strip()
    rc = build_with_keys(project, pub)
    assert rc == UserError.exit_code  # the stub kas stops it, after the key, render and lint
    out = capsys.readouterr()
    assert "stub kas stops here" in out.err
    assert "added to image.ssh_authorized_keys" in out.out
    assert "no SSH key" not in out.err  # the build saw the key
    after = (project / "rocky-vulkan.yaml").read_text()
    assert load_config(project / "rocky-vulkan.yaml").image.ssh_authorized_keys == (line,)
    # Only the one line changed: `[]` became a block list holding the key; every comment stays.
    removed = [x for x in before.splitlines() if x not in after.splitlines()]
    added = [x for x in after.splitlines() if x not in before.splitlines()]
    assert removed == ["  ssh_authorized_keys: []"]
    assert added == ["  ssh_authorized_keys:", f"    - '{line}'"]
    assert [x for x in before.splitlines() if x.lstrip().startswith("#")] == [
        x for x in after.splitlines() if x.lstrip().startswith("#")
    ]
    recipe = next((project / "meta-rocky-vulkan").rglob("rocky-vulkan-image.bb")).read_text()
    assert line.split(" ")[1] in recipe  # rendered into the image recipe


@needs_keygen
def test_more_keys_are_appended_and_the_same_key_is_not_added_twice(project, tmp_path):
    config = project / "rocky-vulkan.yaml"
    pubs = [Path(f"{keygen(tmp_path, kind, f'u@{kind}')}.pub") for kind in ("rsa", "ecdsa")]
    lines = [sshkey.read_public_key(p) for p in pubs]
    assert sshkey.add_authorized_keys(config, lines[:1]) == lines[:1]
    # The first again (another comment: the same key) and the second: only the second is new.
    again = lines[0].rsplit(" ", 1)[0] + " renamed@host"
    assert sshkey.add_authorized_keys(config, [again, lines[1]]) == [lines[1]]
    assert sshkey.add_authorized_keys(config, lines) == []
    assert load_config(config).image.ssh_authorized_keys == tuple(lines)
    text = config.read_text()
    assert text.count("ssh-rsa ") == 1 and text.count("ecdsa-sha2-nistp256 ") == 1
    assert not [n for n in os.listdir(project) if n.startswith(".rocky-vulkan.")]  # no temp left


def _key(byte: int, comment: str) -> str:
    """A well-formed ed25519 public key line (the config's check decodes its fields)."""
    blob = b"".join(len(p).to_bytes(4, "big") + p for p in (b"ssh-ed25519", bytes([byte]) * 32))
    return f"ssh-ed25519 {base64.b64encode(blob).decode()} {comment}"


def test_block_list_with_comments_crlf_and_no_final_newline():
    old, new = _key(7, "old@host"), _key(9, "new@host")
    text = (
        "image:\n  user: rocky\n  ssh_authorized_keys:   # who may log in\n"
        f"    - {old}\n    # a comment between items\n\n  # about the next key\n"
        "  extra_packages: []"
    )
    edited = sshkey.insert_keys(text, [new])
    assert edited == (
        "image:\n  user: rocky\n  ssh_authorized_keys:   # who may log in\n"
        f"    - {old}\n    - '{new}'\n    # a comment between items\n\n  # about the next key\n"
        "  extra_packages: []"
    )
    assert yaml.safe_load(edited)["image"]["ssh_authorized_keys"] == [old, new]
    crlf = "image:\r\n  user: rocky\r\n  ssh_authorized_keys: []  # none yet\r\n"
    edited = sshkey.insert_keys(crlf, [new])
    assert edited == (
        f"image:\r\n  user: rocky\r\n  ssh_authorized_keys:  # none yet\r\n    - '{new}'\r\n"
    )
    at_end = f"image:\n  ssh_authorized_keys:\n  - {old}"  # items at the key's own indent, EOF
    assert sshkey.insert_keys(at_end, [new]) == (
        f"image:\n  ssh_authorized_keys:\n  - {old}\n  - '{new}'\n"
    )


@pytest.mark.parametrize(
    ("shape", "why"),
    [
        ("  ssh_authorized_keys: ['{old}']\n", "`ssh_authorized_keys:` is neither `[]` nor a list"),
        ("  ssh_authorized_keys: !!seq []\n", "`ssh_authorized_keys:` is neither `[]` nor a list"),
        ('  "ssh_authorized_keys": []\n', "no `ssh_authorized_keys:` line directly under"),
    ],
)
def test_shapes_it_does_not_edit_are_refused_and_nothing_changes(project, tmp_path, shape, why):
    config = project / "rocky-vulkan.yaml"
    text = config.read_text().replace(
        "  ssh_authorized_keys: []\n", shape.format(old=_ssh_key("old@host"))
    )
    config.write_text(text)
    load_config(config)  # still a valid config: only its layout is unusual
    before = snapshot(project)
    with pytest.raises(UserError) as err:
        sshkey.add_authorized_keys(config, [_key(9, "new@host")])  # another key than `old`
    assert f"cannot add the key safely: {why}" in str(err.value)
    assert str(err.value).endswith("Nothing was changed.")
    assert snapshot(project) == before


def test_an_edit_that_would_not_read_back_is_refused(project, monkeypatch):
    # Fault injection: an insert_keys that also changes another setting stands in for a layout
    # the textual edit gets wrong; the read-back check must catch it before anything is written.
    real = sshkey.insert_keys
    monkeypatch.setattr(
        sshkey, "insert_keys", lambda t, k: real(t, k).replace("user: rocky", "user: rocco")
    )
    before = snapshot(project)
    with pytest.raises(UserError, match="would change more than that list"):
        sshkey.add_authorized_keys(project / "rocky-vulkan.yaml", [_ssh_key("new@host")])
    assert snapshot(project) == before


def test_a_symlinked_config_is_edited_in_place_and_keeps_its_mode(project, tmp_path):
    real = project / "rocky-vulkan.yaml"
    real.chmod(0o640)
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    assert sshkey.add_authorized_keys(link, [_ssh_key("me@host")]) == [_ssh_key("me@host")]
    assert link.is_symlink() and stat.S_IMODE(real.stat().st_mode) == 0o640
    assert load_config(real).image.ssh_authorized_keys == (_ssh_key("me@host"),)


# ---- hostile files ---------------------------------------------------------------------------

GOOD = _ssh_key("me@host")


@pytest.mark.parametrize(
    ("content", "cause"),
    [
        (f"{GOOD}\n{GOOD}\n".encode(), "holds 2 lines"),
        (f"{GOOD}\n\n".encode(), "holds 2 lines"),
        (GOOD.replace(" me@host", "\tme@host").encode(), "control characters"),
        (f"{GOOD}\x1b[31m\n".encode(), "control characters"),
        (f"{GOOD}\r".encode(), "control characters"),
        (f"{GOOD}\x00".encode(), "control characters"),
        ("ssh-ed25519 AAAAC3Nza€ me@host\n".encode(), "not ASCII text"),
        (b"", "is empty"),
        (b"\n  \n", "is empty"),
        (f'from="10.0.0.0/8",no-pty {GOOD}\n'.encode(), "starts with key options"),
        (GOOD.replace("ssh-ed25519", "ssh-dss").encode(), "does not start with a key type"),
        (f"{GOOD[:60]}\n".encode(), "is not a key line image.ssh_authorized_keys takes"),
        (f"{GOOD} with spaces\n".encode(), "the comment: letters, digits"),
        (b"---- BEGIN SSH2 PUBLIC KEY ----\nAAAA\n---- END SSH2 PUBLIC KEY ----\n", "RFC 4716"),
        (
            b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
            b"-----END OPENSSH PRIVATE KEY-----\n",
            "is a PRIVATE key",
        ),
        (b"PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\n", "is a PRIVATE key"),
    ],
)
def test_bad_key_files_are_refused_and_nothing_is_written(
    project, tmp_path, content, cause, capsys, kas_stub
):
    bad = tmp_path / "key.pub"
    bad.write_bytes(content)
    before = snapshot(project)
    rc = build_with_keys(project, bad)
    err = capsys.readouterr().err
    assert rc == UserError.exit_code
    assert f"{bad}: " in err and cause in err, err
    assert snapshot(project) == before
    assert not kas_stub.exists()  # stopped at the key: no render, no kas


@needs_keygen
def test_a_real_private_key_is_refused_without_echoing_it(project, tmp_path, capsys):
    private = keygen(tmp_path)
    before = snapshot(project)
    assert build_with_keys(project, private) == UserError.exit_code
    err = capsys.readouterr().err
    assert "is a PRIVATE key" in err and f"({private}.pub is there)" in err
    secret_lines = [x for x in private.read_text().splitlines() if "-----" not in x]
    assert not any(x in err for x in secret_lines)
    assert snapshot(project) == before


def test_huge_file_is_refused_by_its_size(project, tmp_path, capsys):
    huge = tmp_path / "huge.pub"
    with open(huge, "wb") as fh:
        fh.truncate(1 << 30)  # sparse: 1 GiB on paper, nothing read
    before = snapshot(project)
    assert build_with_keys(project, huge) == UserError.exit_code
    assert f"larger than 16384 bytes ({1 << 30} bytes)" in capsys.readouterr().err
    assert snapshot(project) == before


def test_non_regular_files_are_refused_without_blocking(project, tmp_path, capsys):
    fifo = tmp_path / "fifo.pub"
    os.mkfifo(fifo)  # nobody writes: a blocking open or read would hang the build
    before = snapshot(project)
    cases = [
        (fifo, "a named pipe (FIFO)"),
        (tmp_path, "a directory"),
        (Path("/dev/zero"), "a character device"),
        (tmp_path / "missing.pub", "no such file; pass a public key file: make a key pair"),
    ]
    for path, cause in cases:
        done: list[int] = []
        worker = threading.Thread(
            target=lambda p=path, d=done: d.append(build_with_keys(project, p))
        )
        worker.start()
        worker.join(timeout=30)
        assert not worker.is_alive(), f"{path} blocked"
        assert done == [UserError.exit_code]
        assert f"{path}: " in (err := capsys.readouterr().err) and cause in err, err
    assert snapshot(project) == before


def test_a_refused_build_leaves_the_config_alone(project, tmp_path, capsys, kas_stub):
    good = tmp_path / "good.pub"
    good.write_text(GOOD + "\n")
    before = snapshot(project)
    argv = ["--config", str(project / "rocky-vulkan.yaml"), "build", "--skip-doctor"]
    assert main([*argv, "--ssh-key", str(good)]) == UserError.exit_code  # no licence fragment
    assert "add --fragment model-licence" in capsys.readouterr().err
    assert snapshot(project) == before and not kas_stub.exists()


def test_one_bad_file_among_good_ones_changes_nothing(project, tmp_path, capsys):
    good = tmp_path / "good.pub"
    good.write_text(GOOD + "\n")
    bad = tmp_path / "bad.pub"
    bad.write_text(GOOD + "\n" + GOOD + "\n")
    before = snapshot(project)
    assert build_with_keys(project, good, bad) == UserError.exit_code
    assert "holds 2 lines" in capsys.readouterr().err
    assert snapshot(project) == before


def test_an_invalid_config_is_reported_before_any_edit(project, tmp_path, capsys):
    config = project / "rocky-vulkan.yaml"
    config.write_text(config.read_text().replace("user: rocky", "user: root"))
    good = tmp_path / "good.pub"
    good.write_text(GOOD + "\n")
    before = snapshot(project)
    assert build_with_keys(project, good) == UserError.exit_code
    assert "image.user: 'root'" in capsys.readouterr().err
    assert snapshot(project) == before


def test_cli_help_names_the_option():
    done = subprocess.run(
        [sys.executable, "-m", "rocky_vulkan.cli", "build", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert "--ssh-key FILE" in done.stdout
