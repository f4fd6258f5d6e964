"""Issue 53, the status page (``/ui``): a real front with two embedded engines behind an API key, looked at in a real
headless Chromium (Debian's ``chromium`` and ``chromium-driver``: ``.ci/run`` installs them; skipped with the reason
where they are missing). The page loads, asks for the key, shows each model's state; a request changes what it shows;
its park button parks the model.

Run: pytest tests/test_switch_page.py
"""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from switch_front import Front, private_keeper

CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (Path(CHROMEDRIVER).exists() and Path(CHROMIUM).exists()),
                       reason="no headless Chromium here: apt-get install chromium chromium-driver (.ci/run does)"),
]


@pytest.fixture
def browser():
    selenium = pytest.importorskip("selenium", reason="pip install '.[test]' brings selenium")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    assert selenium.__version__
    try:
        yield driver
    finally:
        driver.quit()


def until(what, seconds: float = 60.0):
    """``what()`` once it is truthy; fails after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not (got := what()):
        assert time.monotonic() < deadline, f"not within {seconds} s"
        time.sleep(0.2)
    return got


def post(url: str, body: dict, key: str) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "content-type": "application/json", "authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.loads(r.read())


def test_the_status_page_shows_states_a_request_changes_them_and_its_button_parks(tmp_path, browser):
    from hotweights.demo_model import write_demo_model
    from selenium.webdriver.common.by import By

    model = write_demo_model(tmp_path / "m", "tiny")
    with private_keeper("hwpage-") as sock:
        f = Front(tmp_path, {"a": model, "b": model}, "--api-key", "sesame", "--max-awake", "1", socket_dir=sock)
        try:
            until(lambda: all(m["state"] in ("awake", "parked") for m in f.status("sesame")["models"]), 120)
            with pytest.raises(urllib.error.HTTPError):  # the page holds no data: its data needs the key
                f.status()

            browser.get(f.url + "/")  # redirected to /ui
            assert browser.current_url.endswith("/ui") and browser.title == "hotweights switch"
            summary = browser.find_element(By.ID, "summary")
            until(lambda: "API key" in summary.text, 10)
            key = browser.find_element(By.ID, "key")
            key.send_keys("sesame")
            browser.execute_script("arguments[0].dispatchEvent(new Event('change'))", key)

            def state(name: str) -> str:
                cells = browser.find_elements(By.CSS_SELECTOR, f'tr[data-model="{name}"] .state')
                return cells[0].text if cells else ""

            assert until(lambda: state("a")) == "awake"  # the default, awake at start-up
            assert state("b") == "parked"
            assert "2 models, 1 awake" in summary.text

            said = post(f.url + "/v1/completions", {"model": "b", "prompt": "hello", "max_tokens": 4}, "sesame")
            assert said["model"] == "b" and said["usage"]["completion_tokens"] >= 1, said
            until(lambda: state("b") == "awake" and state("a") == "parked")  # a parked for it (max_awake 1)
            switches = browser.find_element(By.ID, "switches")
            # its row of the last switches (made again at each refresh: read as the table's text): b, a parked for it
            assert until(lambda: re.search(r" b \d+\.\d{3} s \w+ \d+\.\d{3} s a$", switches.text, re.M))
            row = browser.find_element(By.CSS_SELECTOR, 'tr[data-model="b"]')
            assert row.find_elements(By.CSS_SELECTOR, "td")[9].text == "1"  # its request of the last minute

            row.find_element(By.CSS_SELECTOR, 'button[data-action="park"]').click()
            until(lambda: state("b") == "parked")
            until(lambda: "b: park done, now parked" in browser.find_element(By.ID, "message").text, 10)
            assert {m["name"]: m["state"] for m in f.status("sesame")["models"]} == {"a": "parked", "b": "parked"}
        finally:
            f.interrupt()
