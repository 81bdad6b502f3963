"""The board's own paths, redirected for every test here: a run with a broken config falls back
to /var/lib/rocky-selftest and /etc/motd (settings.fallback_paths), and a by-hand run and
`status` use /run/rocky-selftest; on a developer's machine (as root) those must never be written.
Only the self-test's view of them moves (the layer's rendering keeps the real ones)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


@pytest.fixture(autouse=True)
def board_paths_in_tmp(tmp_path_factory, monkeypatch):
    from rocky_selftest import outcome, paths, settings

    where = tmp_path_factory.mktemp("board")
    moved = SimpleNamespace(**vars(paths))
    moved.RESULTS_DIR = str(where / "var-lib-rocky-selftest")
    moved.MOTD = str(where / "etc-motd")
    monkeypatch.setattr(settings, "paths", moved)
    monkeypatch.setattr(outcome, "DEFAULT_NOTE_DIR", str(where / "run-rocky-selftest"))
