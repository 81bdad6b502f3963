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

import json
import shutil

import pytest

from tests.helpers.llama_bin import BIN_DIR
from tests.helpers.serve import TEXT_ONLY, spki_sha256_b64, unit_server

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.needs_llama_bin,
    pytest.mark.needs_tool("chromium", "Debian: apt-get install chromium; .ci/run does"),
    pytest.mark.needs_tool("chromedriver", "Debian: apt-get install chromium-driver"),
]

CONFIG_KEY = "LlamaCppWebui.config"
PROMPT = "Say hello to the board."  # the web UI's settings in localStorage (its bundle.js)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with unit_server(tmp_path_factory, "webui", BIN_DIR) as (server, info, tmp):
        yield server, info, tmp


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


def _webui_config(api_key: str) -> str:
    """The web UI's saved settings: the API key, and (its "custom JSON" setting, merged into
    each request) the byte-token ban the random test model needs (tests/helpers/serve.py)."""
    custom = json.dumps({"logit_bias": TEXT_ONLY, "max_tokens": 8, "temperature": 0})
    return json.dumps({"apiKey": api_key, "custom": custom})


def test_without_the_pin_the_browser_refuses_the_page(served):
    server, _, tmp = served
    driver = _browser(tmp / "profile-nopin", spki=None)
    try:
        driver.get(f"https://127.0.0.1:{server.port}/")
        page = driver.page_source
        assert "ERR_CERT_AUTHORITY_INVALID" in page or "not private" in page, page[:2000]
        assert "LlamaCppWebui" not in page
    finally:
        driver.quit()


def test_web_ui_loads_over_pinned_https_and_answers_a_prompt(served):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    server, info, tmp = served
    spki = spki_sha256_b64(info["cert"])
    driver = _browser(tmp / "profile", spki=spki)
    try:
        config = json.dumps(_webui_config(server.api_key))
        script = f"localStorage.setItem({json.dumps(CONFIG_KEY)}, {config});"
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": script})
        driver.get(f"https://127.0.0.1:{server.port}/")
        wait = WebDriverWait(driver, 120)
        box = wait.until(
            lambda d: next(
                (
                    t
                    for t in d.find_elements(By.TAG_NAME, "textarea")
                    if t.is_displayed() and t.is_enabled()
                ),
                None,
            )
        )
        box.send_keys(PROMPT)
        box.send_keys(Keys.ENTER)
        sel = '[aria-label="Assistant message with actions"]'
        # Done when the message shows its statistics ("8 tokens": max_tokens from the custom
        # setting); the answer is its rendered markdown.
        msg = wait.until(
            lambda d: next(
                (e for e in d.find_elements(By.CSS_SELECTOR, sel) if "8 tokens" in e.text), None
            )
        )
        answer = msg.find_element(By.CSS_SELECTOR, ".markdown-block").text
        print(f"web UI answer: {answer!r}")
        # The same question through the API, greedy as the UI's request was: the same answer.
        _, data = server.request(
            "POST", "/v1/chat/completions",
            {"model": "reference", "messages": [{"role": "user", "content": PROMPT}],
             "max_tokens": 8, "temperature": 0, "logit_bias": TEXT_ONLY},
        )  # fmt: skip
        direct = json.loads(data)["choices"][0]["message"]["content"]
        assert answer and " ".join(answer.split()) == " ".join(direct.split()), (answer, direct)
        (tmp / "webui.png").write_bytes(driver.get_screenshot_as_png())
    finally:
        driver.quit()
