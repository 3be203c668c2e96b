"""grader label in a real headless browser (Chromium and its driver, through selenium): three
rows labeled by keyboard, the server killed with SIGKILL, started again, one more row, and the
labels file checked. In CI (CI set) a missing browser fails the test; elsewhere it skips with
the command that installs one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from test_label import ROWS, texts, write_run

from grader.io.labels import read_labels, results_key

INSTALL = ("apt-get install -y chromium chromium-driver && pip install selenium "
           "(bash scripts/setup.sh does both where it runs as root)")


def _browser_parts() -> tuple[str, str]:
    """The Chromium binary and its driver; a skip (a failure in CI) where either is missing."""
    missing = []
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None:
        missing.append("chromium")
    if driver is None:
        missing.append("chromedriver")
    if missing:
        message = f"no {', '.join(missing)}: {INSTALL}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI runs the browser test: {message}")
        pytest.skip(message)
    assert chromium is not None and driver is not None
    return chromium, driver


@pytest.fixture
def browser():
    chromium, driver = _browser_parts()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1200,900"):
        options.add_argument(argument)
    browser = webdriver.Chrome(service=Service(driver), options=options)
    yield browser
    browser.quit()


def start_server(results: Path, data: Path, out: Path) -> tuple[subprocess.Popen, str]:
    """``python -m grader label`` as its own process; returns it and the page's URL."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        [sys.executable, "-m", "grader", "label", str(results), "-o", str(out),
         "--data", str(data), "--sample", "6", "--seed", "11", "--no-browser"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    assert process.stdout is not None
    seen = []
    for line in process.stdout:  # the URL line comes once the port is bound and the file ready
        seen.append(line)
        if line.startswith("labeling page: "):
            return process, line.removeprefix("labeling page: ").strip()
    process.wait(timeout=10)
    raise AssertionError(f"grader label exited {process.returncode}:\n{''.join(seen)}")


def wait_for(browser, attribute: str, value: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 20).until(
        lambda b: b.find_element("tag name", "body").get_attribute(f"data-{attribute}") == value,
        message=f"body data-{attribute} never became {value!r}",
    )


def press(browser, keys: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser).send_keys(keys).perform()


def test_label_by_keyboard_survive_a_kill_and_resume(tmp_path, browser):
    from selenium.webdriver.common.keys import Keys

    data, results = write_run(tmp_path)
    out = tmp_path / "labels.jsonl"
    given = [4, 0, 5, 2]

    process, url = start_server(results, data, out)
    try:
        browser.get(url)
        wait_for(browser, "ready", "yes")
        wait_for(browser, "position", "0")
        for position, score in enumerate(given[:3]):
            judge = browser.find_element("id", "judge")
            assert not judge.is_displayed()  # hidden until the row is labeled
            press(browser, str(score))
            wait_for(browser, "labeled", "yes")
            assert judge.is_displayed() and "The judge said" in judge.text
            chosen = browser.find_element("css selector", "#scores button.chosen")
            assert chosen.text == str(score)
            press(browser, Keys.ENTER)
            wait_for(browser, "position", str(position + 1))
        assert "4 of 6" in browser.find_element("id", "progress").text
        assert "labeled 3" in browser.find_element("id", "progress").text
    finally:
        os.kill(process.pid, signal.SIGKILL)  # no shutdown, no flush: only what is on disk
        process.wait(timeout=10)
        process.stdout.close()

    # three labels survived the kill; a new server goes on at the fourth row
    assert [e["human"] for e in map(json.loads, out.read_text().splitlines()[1:])] == given[:3]
    process, url = start_server(results, data, out)
    try:
        browser.get(url)
        wait_for(browser, "ready", "yes")
        wait_for(browser, "position", "3")
        assert "labeled 3" in browser.find_element("id", "progress").text
        press(browser, str(given[3]))
        wait_for(browser, "labeled", "yes")
        assert "width" in browser.find_element("id", "estimate").text  # the interval, from 2 labels
    finally:
        process.send_signal(signal.SIGINT)  # Ctrl-C: the ordinary way to stop it
        output, _ = process.communicate(timeout=10)
    assert process.returncode == 0, output
    assert "4 labeled, 0 skipped of 6" in output

    header, *events = [json.loads(line) for line in out.read_text().splitlines()]
    assert header["seed"] == 11 and header["sample"] == 6 and len(header["order"]) == 6
    assert [e["position"] for e in events] == [0, 1, 2, 3]
    assert [e["id"] for e in events] == header["order"][:4]
    assert [e["human"] for e in events] == given
    labels = read_labels(out, texts(ROWS), results_key=results_key(texts(ROWS)))
    assert labels.scores == dict(zip(header["order"][:4], given))
    assert labels.random and labels.stale == ()
