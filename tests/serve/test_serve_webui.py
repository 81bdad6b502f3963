"""The server's web UI in a real browser (issue 20): Debian's chromium, headless, driven by its
chromedriver through selenium, against the real llama-server started with the unit's command
line (as in test_serve_api.py; systemd is not running it).

The board's certificate is self-signed: chromium trusts it through
--ignore-certificate-errors-spki-list=<base64 SHA-256 of its public key>, which pins that one
key (a browser without the flag refuses the page: checked too). The web UI takes the API key
from its settings, kept in localStorage under `LlamaCppWebui.config` ({"apiKey": ...}); the
test puts it there before the page's scripts run, as a user's saved settings would be.
"""

from __future__ import annotations

import shutil

import pytest

from tests.helpers.llama_bin import BIN_DIR
from tests.helpers.selftest import make_tiny_model
from tests.helpers.serve import start_unit_server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.needs_llama_bin,
    pytest.mark.needs_tool("chromium", "Debian: apt-get install chromium; .ci/run does"),
    pytest.mark.needs_tool("chromedriver", "Debian: apt-get install chromium-driver"),
]

CONFIG_KEY = "LlamaCppWebui.config"  # the web UI's settings in localStorage (its bundle.js)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("webui")
    model = make_tiny_model(tmp_path_factory)
    server, info = start_unit_server(tmp, BIN_DIR, model, gpu=False)
    try:
        yield server, info, tmp
    finally:
        server.stop()


def _browser(tmp, spki: str | None):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container: chromium's own sandbox cannot start
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--user-data-dir={tmp}",  # the SPKI list is honoured with a profile of its own
        "--window-size=1280,900",
    ):
        opts.add_argument(arg)
    if spki:
        opts.add_argument(f"--ignore-certificate-errors-spki-list={spki}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=opts, service=Service(shutil.which("chromedriver")))
