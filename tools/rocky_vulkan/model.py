"""`rocky-vulkan model fetch`: download the reference model, resumable and verified by sha256,
and pin the checksum into rocky-vulkan.yaml on the first download when it is still null."""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import requests

from .config import load_config
from .errors import UserError

CHUNK = 1 << 20
# Small network reads: what arrived before a connection dies is on disk for the resume.
NET_CHUNK = 64 << 10
DEFAULT_DEST = "build/models"
# Statuses that will not change by asking again.
PERMANENT = {400, 401, 403, 404, 410}


class DownloadError(UserError):
    """The download failed for good (after retries, or with a permanent HTTP status)."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
    )


def _attempt(session: requests.Session, url: str, part: Path, timeout: tuple[float, float], bar):
    """One GET from where the .part file ends; returns when the body ended cleanly."""
    offset = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    with session.get(url, headers=headers, stream=True, timeout=timeout) as resp:
        if resp.status_code == 416 and offset:
            # Nothing left past our offset: the .part is complete (or longer than the file).
            return
        if resp.status_code in PERMANENT:
            raise DownloadError(
                f"{url}: HTTP {resp.status_code} {resp.reason}; check model.url in "
                "rocky-vulkan.yaml (and access to the file)"
            )
        resp.raise_for_status()
        mode = "ab"
        if resp.status_code == 206:
            start = re.match(r"bytes (\d+)-", resp.headers.get("Content-Range", ""))
            if not start or int(start.group(1)) != offset:
                raise requests.exceptions.ContentDecodingError("server resumed at the wrong offset")
        else:
            mode, offset = "wb", 0  # the server ignored Range: start over
        length = resp.headers.get("Content-Length")
        total = offset + int(length) if length and length.isdigit() else None
        bar.update(bar.task_ids[0], total=total, completed=offset)
        with open(part, mode) as fh:
            for chunk in resp.iter_content(NET_CHUNK):
                fh.write(chunk)
                bar.advance(bar.task_ids[0], len(chunk))
        size = part.stat().st_size
        if total is not None and size != total:
            raise requests.exceptions.ChunkedEncodingError(f"got {size} of {total} bytes")


def download(
    url: str,
    dest: Path,
    *,
    retries: int = 5,
    backoff_s: float = 2.0,
    timeout: tuple[float, float] = (15.0, 60.0),
    progress: bool = True,
    session: requests.Session | None = None,
) -> Path:
    """Download `url` into `dest`.part, resuming what is there; return the .part path."""
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    session = session or requests.Session()
    last_error = ""
    with _progress(progress) as bar:
        bar.add_task(dest.name, total=None)
        for attempt in range(retries + 1):
            try:
                _attempt(session, url, part, timeout, bar)
                return part
            except DownloadError:
                raise
            except (requests.exceptions.RequestException, OSError) as err:
                last_error = f"{type(err).__name__}: {err}"
                status = getattr(getattr(err, "response", None), "status_code", None)
                if status in PERMANENT:
                    raise DownloadError(f"{url}: HTTP {status}") from None
            if attempt < retries:
                wait = backoff_s * (2**attempt)
                bar.console.print(
                    f"attempt {attempt + 1} failed ({last_error}); retry in {wait:g} s"
                )
                time.sleep(wait)
    have = part.stat().st_size if part.exists() else 0
    raise DownloadError(
        f"{url}: download failed after {retries + 1} attempts ({last_error}); {have} bytes kept "
        f"in {part}: run the command again to resume"
    )


def pin_sha256(config_path: Path, sha256: str) -> None:
    """Replace `sha256: null` in the model: block, touching only that line."""
    lines = config_path.read_text(encoding="utf-8").splitlines(keepends=True)
    in_model, hit = False, None
    for i, line in enumerate(lines):
        if re.match(r"^\S", line):
            in_model = line.startswith("model:")
            continue
        if in_model and re.match(r"^\s+sha256:\s*null\s*(#.*)?$", line.rstrip("\n")):
            hit = i
            break
    if hit is None:
        raise UserError(
            f"{config_path}: no `sha256: null` line under model:; "
            f"set model.sha256 to {sha256} by hand"
        )
    lines[hit] = re.sub(r"null", sha256, lines[hit], count=1)
    fd, tmp = tempfile.mkstemp(prefix=".rocky-vulkan.", dir=config_path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.writelines(lines)
    os.chmod(tmp, config_path.stat().st_mode & 0o777)
    os.replace(tmp, config_path)
    if load_config(config_path).model.sha256 != sha256:  # the edit must read back
        raise UserError(f"{config_path}: pinning model.sha256 did not read back; check the file")


def fetch_model(config_path: Path, dest_dir: Path, **kwargs) -> tuple[Path, str, bool]:
    """Fetch the configured model into dest_dir; return (path, sha256, pinned_now)."""
    cfg = load_config(config_path)
    dest = dest_dir / cfg.model.filename
    expected = cfg.model.sha256
    if expected and dest.is_file() and sha256_of(dest) == expected:
        return dest, expected, False
    part = download(cfg.model.url, dest, **kwargs)
    actual = sha256_of(part)
    if expected and actual != expected:
        bad = dest.with_name(dest.name + ".sha256-mismatch")
        os.replace(part, bad)
        kept = f"; {dest} was left as it was" if dest.exists() else ""
        raise UserError(
            f"{cfg.model.url}: downloaded file has sha256 {actual}, but model.sha256 in "
            f"{config_path.name} is {expected}. Nothing was replaced{kept}; the download is in "
            f"{bad}. If upstream replaced the file on purpose, check where the new one comes "
            "from, then set model.sha256 to the new value and run `rocky-vulkan render`; "
            f"otherwise delete {bad} and run `rocky-vulkan model fetch` again."
        )
    os.replace(part, dest)
    if not expected:
        pin_sha256(config_path, actual)
        return dest, actual, True
    return dest, actual, False


def _run_fetch(args: argparse.Namespace) -> int:
    config_path = Path(args.config).resolve()
    dest_dir = Path(args.dest) if args.dest else load_config(config_path).root / DEFAULT_DEST
    path, sha, pinned = fetch_model(
        config_path,
        dest_dir,
        retries=args.retries,
        timeout=(args.connect_timeout, args.read_timeout),
        progress=sys.stderr.isatty() and not args.no_progress,
    )
    print(f"{path}: sha256 {sha} verified")
    if pinned:
        print(
            f"pinned model.sha256 in {config_path.name} (it was null); "
            "now run `rocky-vulkan render` and commit both"
        )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("model", help="the reference model: fetch and verify")
    model_sub = parser.add_subparsers(dest="model_command", required=True)
    fetch = model_sub.add_parser(
        "fetch", help="download model.url (resumable), verify or pin its sha256"
    )
    fetch.add_argument("--dest", help=f"folder for the model (default: {DEFAULT_DEST}/)")
    fetch.add_argument("--retries", type=int, default=5, help="retries after the first try")
    fetch.add_argument("--connect-timeout", type=float, default=15.0, help="seconds")
    fetch.add_argument("--read-timeout", type=float, default=60.0, help="seconds without data")
    fetch.add_argument("--no-progress", action="store_true", help="no progress bar")
    fetch.set_defaults(func=_run_fetch)
