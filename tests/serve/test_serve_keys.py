"""The board's own API key and TLS certificate (rocky_selftest.serve_keys, `rocky-llm keys`),
made with the real openssl; the fingerprint checked against openssl's own."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest
from rocky_selftest import paths
from rocky_selftest.serve_keys import (
    KEY_RE,
    ServeKeyError,
    cert_fingerprint,
    make_certificate,
    make_missing,
    read_api_key,
    write_api_key,
)

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def test_make_missing_makes_a_key_and_a_certificate_once(tmp_path):
    keys = tmp_path / "keys"
    made = make_missing(str(keys), "rock-5-itx", None, tls=True)
    assert made == ["API key", "TLS certificate"]
    key = read_api_key(str(keys))
    assert KEY_RE.fullmatch(key)
    assert stat.S_IMODE((keys / paths.TLS_KEY_NAME).stat().st_mode) == 0o600
    assert stat.S_IMODE((keys / paths.API_KEY_NAME).stat().st_mode) == 0o600
    assert make_missing(str(keys), "rock-5-itx", None, tls=True) == []  # nothing replaced
    assert read_api_key(str(keys)) == key
    assert not [p.name for p in keys.iterdir() if p.name.endswith(".new") or p.name[0] == "."]


def test_every_board_gets_its_own_key_and_certificate(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    make_missing(str(a), "rock-5-itx", None, tls=True)
    make_missing(str(b), "rock-5-itx", None, tls=True)
    assert read_api_key(str(a)) != read_api_key(str(b))
    fa = cert_fingerprint(str(a / paths.TLS_CERT_NAME))
    assert fa != cert_fingerprint(str(b / paths.TLS_CERT_NAME))


def test_fingerprint_matches_openssl_and_names_the_board(tmp_path):
    make_certificate(str(tmp_path), "rock-5b")
    cert = tmp_path / paths.TLS_CERT_NAME
    out = subprocess.run(
        ["openssl", "x509", "-in", str(cert), "-noout", "-fingerprint", "-sha256", "-ext",
         "subjectAltName"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert f"={cert_fingerprint(str(cert))}" in out
    assert "DNS:rock-5b.local" in out and "DNS:localhost" in out


def test_rotation_replaces_the_key(tmp_path):
    make_missing(str(tmp_path), "rock-5-itx", None, tls=False)
    old = read_api_key(str(tmp_path))
    assert write_api_key(str(tmp_path), None) != old
    assert read_api_key(str(tmp_path)) != old


@pytest.mark.parametrize("host", ["-subj /CN=x", "a b", "x;reboot", "", "a" * 64, "rock\n5"])
def test_a_hostile_hostname_is_refused_before_openssl_runs(tmp_path, host):
    with pytest.raises(ServeKeyError, match="hostname"):
        make_certificate(str(tmp_path), host)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content", ["", "rk-short", "rk-" + "g" * 48, "\x1b[2Jrk-" + "0" * 48])
def test_a_damaged_key_file_is_an_error_with_the_fix(tmp_path, content):
    (tmp_path / paths.API_KEY_NAME).write_text(content)
    with pytest.raises(ServeKeyError, match="rotate-key"):
        read_api_key(str(tmp_path))


def test_a_failing_openssl_leaves_nothing_behind(tmp_path):
    # Fault injection: a missing openssl binary (the real one cannot be made to fail on demand).
    with pytest.raises(ServeKeyError, match="openssl"):
        make_certificate(str(tmp_path), "rock-5-itx", openssl=str(tmp_path / "no-openssl"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to a group needs root")
def test_the_login_group_may_read_the_key_and_nobody_else(tmp_path):
    make_missing(str(tmp_path / "k"), "rock-5-itx", 4242, tls=True)
    key = tmp_path / "k" / paths.API_KEY_NAME
    assert (key.stat().st_gid, stat.S_IMODE(key.stat().st_mode)) == (4242, 0o640)
    tls_key = tmp_path / "k" / paths.TLS_KEY_NAME
    assert stat.S_IMODE(tls_key.stat().st_mode) == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another group needs root")
def test_a_key_whose_group_was_taken_gets_it_back(tmp_path):
    """systemd's StateDirectory= chowns a directory it finds owned otherwise to the unit's
    user and group: before the unit named Group=, every reboot left the key root:root 0640."""
    keys = tmp_path / "keys"
    make_missing(str(keys), "rock-5-itx", 44, tls=False)
    key = keys / paths.API_KEY_NAME
    os.chown(key, 0, 0)
    assert make_missing(str(keys), "rock-5-itx", 44, tls=False) == []
    assert (key.stat().st_uid, key.stat().st_gid, stat.S_IMODE(key.stat().st_mode)) == (
        0,
        44,
        0o640,
    )
