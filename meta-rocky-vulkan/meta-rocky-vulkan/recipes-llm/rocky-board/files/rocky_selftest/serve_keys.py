"""The board's own API key and TLS certificate, made on the board at first boot.

Nothing secret is in the image, the build tree or sstate: each board makes its key and its
certificate when it first starts the server. The key is readable by root and the login user's
group only; the TLS private key by root only (systemd's LoadCredential= hands both to the server).
"""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import re
import secrets
import subprocess

from . import paths
from .files import UnreadableFile, read_text
from .results import write_atomic

KEY_RE = re.compile(r"rk-[0-9a-f]{48}")
OPENSSL_TIMEOUT_S = 120
CERT_DAYS = 3650


class ServeKeyError(Exception):
    """A key or certificate could not be made or read; the message says what to do."""


def _path(key_dir: str, name: str) -> str:
    return os.path.join(key_dir, name)


def new_api_key() -> str:
    return "rk-" + secrets.token_hex(24)


def read_api_key(key_dir: str) -> str:
    path = _path(key_dir, paths.API_KEY_NAME)
    try:
        text = read_text(path, 256).strip()
    except UnreadableFile as err:
        if err.errno in (errno.EACCES, errno.EPERM):
            why = "only root and the login user may read the API key"
            raise ServeKeyError(f"{path}: {why}") from None
        raise ServeKeyError(str(err)) from None
    except OSError as err:
        raise ServeKeyError(f"cannot read {path}: {err}") from None
    if not KEY_RE.fullmatch(text):
        raise ServeKeyError(f"{path}: not an API key; make a new one with `rocky-llm rotate-key`")
    return text


def write_api_key(key_dir: str, group_gid: int | None) -> str:
    """A new key, written atomically (0640, group = the login user's group)."""
    key = new_api_key()
    path = _path(key_dir, paths.API_KEY_NAME)
    write_atomic(path, (key + "\n").encode(), mode=0o600)
    if group_gid is not None:
        os.chown(path, 0, group_gid)
        os.chmod(path, 0o640)
    return key


def cert_fingerprint(cert_path: str) -> str:
    """SHA-256 of the certificate's DER bytes, as browsers and `openssl x509 -fingerprint`
    show it (AA:BB:...)."""
    try:
        pem = read_text(cert_path, 65536)
    except UnreadableFile as err:
        raise ServeKeyError(str(err)) from None
    except OSError as err:
        raise ServeKeyError(f"cannot read {cert_path}: {err}") from None
    m = re.search(r"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", pem, re.S)
    if not m:
        raise ServeKeyError(f"{cert_path}: no PEM certificate in it")
    try:
        der = base64.b64decode("".join(m.group(1).split()), validate=True)
    except ValueError:
        raise ServeKeyError(f"{cert_path}: the certificate is not valid base64") from None
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def make_certificate(key_dir: str, hostname: str, openssl: str = "openssl") -> None:
    """A self-signed P-256 certificate for <hostname>.local, <hostname> and localhost; the
    private key is 0600. Written under temporary names, then renamed: never half a pair."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]{0,62}", hostname):
        raise ServeKeyError(f"hostname {hostname!r} is not a plain host name; fix /etc/hostname")
    key, cert = _path(key_dir, paths.TLS_KEY_NAME), _path(key_dir, paths.TLS_CERT_NAME)
    tmp_key, tmp_cert = key + ".new", cert + ".new"
    names = f"DNS:{hostname}.local,DNS:{hostname},DNS:localhost,IP:127.0.0.1"
    cmd = [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    cmd += ["-nodes", "-keyout", tmp_key, "-out", tmp_cert, "-days", str(CERT_DAYS)]
    cmd += ["-subj", f"/CN={hostname}.local", "-addext", f"subjectAltName={names}"]
    old = os.umask(0o077)
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=OPENSSL_TIMEOUT_S)
        if res.returncode != 0:
            tail = " ".join(res.stderr.split())[-300:]
            raise ServeKeyError(
                f"openssl could not make the certificate (exit {res.returncode}): {tail}"
            )
        os.chmod(tmp_cert, 0o644)
        os.replace(tmp_key, key)
        os.replace(tmp_cert, cert)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ServeKeyError(f"openssl could not make the certificate: {err}") from None
    finally:
        os.umask(old)
        for leftover in (tmp_key, tmp_cert):
            if os.path.exists(leftover):
                os.unlink(leftover)


def make_missing(key_dir: str, hostname: str, group_gid: int | None, tls: bool) -> list[str]:
    """Make what is missing (the key; the certificate when `tls`); returns what was made."""
    os.makedirs(key_dir, mode=0o750, exist_ok=True)
    if group_gid is not None:
        os.chown(key_dir, 0, group_gid)
        os.chmod(key_dir, 0o750)
    made = []
    key_path = _path(key_dir, paths.API_KEY_NAME)
    if not os.path.exists(key_path):
        write_api_key(key_dir, group_gid)
        made.append("API key")
    elif group_gid is not None:  # a key whose group was taken away (an older unit) gets it back
        if os.path.islink(key_path):
            raise ServeKeyError(f"{key_path} is a symbolic link: remove it and run this again")
        os.chown(key_path, 0, group_gid)
        os.chmod(key_path, 0o640)
    cert_there = os.path.exists(_path(key_dir, paths.TLS_CERT_NAME))
    if tls and not (cert_there and os.path.exists(_path(key_dir, paths.TLS_KEY_NAME))):
        make_certificate(key_dir, hostname)
        made.append("TLS certificate")
    return made
