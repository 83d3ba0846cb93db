"""The chat page at / in a real browser: headless Chromium driven by selenium against `edgellm serve`
(with an API key, so the page must ask for it). Runs where Debian's `chromium` and `chromium-driver` are
installed (.ci/run installs them); skipped elsewhere."""

from __future__ import annotations

import os
import shutil
import time

import pytest

httpx = pytest.importorskip("httpx")
webdriver = pytest.importorskip("selenium.webdriver")

from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402
from test_server import KEY, Server  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
DRIVER = shutil.which("chromedriver")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs chromium and chromedriver (Debian packages)"),
]


@pytest.fixture(scope="module")
def server(smollm2_path, tmp_path_factory):
    pytest.importorskip("fastapi")
    with Server(smollm2_path, tmp_path_factory.mktemp("web") / "web.log", env={"EDGELLM_API_KEY": KEY}) as s:
        yield s


@pytest.fixture(scope="module")
def browser():
    os.environ.setdefault("SE_AVOID_STATS", "true")  # selenium-manager stays offline
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(executable_path=DRIVER), options=opts)
    try:
        yield drv
    finally:
        drv.quit()


def _wait(drv, cond, timeout=120):
    return WebDriverWait(drv, timeout, poll_frequency=0.1).until(cond)


def _fill(drv, element_id: str, text: str) -> None:
    e = drv.find_element(By.ID, element_id)
    e.clear()
    e.send_keys(text)


def _answers(drv) -> list[str]:
    return [e.text for e in drv.find_elements(By.CSS_SELECTOR, ".msg.assistant")]


def test_the_chat_page_asks_for_the_key_streams_an_answer_and_keeps_the_conversation(server, browser):
    drv = browser
    page = httpx.get(server.url + "/")  # the page needs no key; everything it loads is in it
    assert page.status_code == 200 and "default-src 'none'" in page.headers["content-security-policy"]
    assert "http://" not in page.text.replace("http://www.w3.org", "") and "<script src" not in page.text
    drv.get(server.url + "/")
    _wait(drv, EC.visibility_of_element_located((By.ID, "key")))  # /v1/models said 401: it asks
    drv.find_element(By.ID, "key").send_keys(KEY)
    drv.find_element(By.ID, "savekey").click()
    _wait(drv, lambda d: d.find_element(By.ID, "model").text == "SmolLM2-135M-Instruct.Q4_1")
    drv.find_element(By.TAG_NAME, "summary").click()  # settings: a system prompt and temperature 0
    drv.find_element(By.ID, "system").send_keys("You are a geography teacher.")
    _fill(drv, "temperature", "0")
    _fill(drv, "max_tokens", "12")
    drv.find_element(By.ID, "input").send_keys("What is the capital of France?")
    drv.find_element(By.ID, "send").click()
    _wait(drv, lambda d: d.find_element(By.ID, "send").is_enabled() and _answers(d) and _answers(d)[0])
    msgs = [{"role": "system", "content": "You are a geography teacher."},
            {"role": "user", "content": "What is the capital of France?"}]  # fmt: skip
    api = httpx.post(
        server.url + "/v1/chat/completions",
        json={"messages": msgs, "max_tokens": 12, "temperature": 0},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
    ).json()["choices"][0]["message"]["content"]
    assert _answers(drv) == [api.strip()] or _answers(drv) == [api]  # the page sent what it showed
    drv.refresh()  # the conversation stays in the browser
    _wait(drv, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg")) == 2)
    assert drv.find_elements(By.CSS_SELECTOR, ".msg.user")[0].text == "What is the capital of France?"


def test_the_stop_button_ends_a_long_answer_and_frees_the_server(server, browser):
    drv = browser
    drv.find_element(By.ID, "new").click()
    assert not drv.find_elements(By.CSS_SELECTOR, ".msg")  # a new chat is empty
    drv.execute_script("document.querySelector('details').open = true")
    _fill(drv, "max_tokens", "400")
    drv.find_element(By.ID, "input").send_keys("Write a very long story about a dragon.")
    drv.find_element(By.ID, "send").click()
    _wait(drv, lambda d: _answers(d) and len(_answers(d)[0]) > 10)  # streaming has started
    drv.find_element(By.ID, "stop").click()
    _wait(drv, lambda d: d.find_element(By.ID, "send").is_enabled(), timeout=10)
    stopped = _answers(drv)[0]
    time.sleep(1.0)
    assert _answers(drv)[0] == stopped  # nothing more arrives
    headers = {"Authorization": f"Bearer {KEY}"}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the server cancelled the sequence (the client went away)
        metrics = httpx.get(server.url + "/metrics", headers=headers).text
        if "edgellm_running_sequences 0" in metrics and "edgellm_requests_cancelled_total 1" in metrics:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(metrics)


def test_message_text_is_shown_as_text_never_as_markup(server, browser):
    drv = browser
    drv.find_element(By.ID, "new").click()
    drv.execute_script("document.querySelector('details').open = true")
    _fill(drv, "max_tokens", "1")
    drv.find_element(By.ID, "input").send_keys('<img src=x onerror="document.title=1"><b>bold</b>')
    drv.find_element(By.ID, "send").click()
    _wait(drv, lambda d: d.find_element(By.ID, "send").is_enabled() and _answers(d))
    user = drv.find_elements(By.CSS_SELECTOR, ".msg.user")[0]
    assert user.text == '<img src=x onerror="document.title=1"><b>bold</b>'
    assert not user.find_elements(By.TAG_NAME, "img") and drv.title == "edgellm"
