"""A real headless Chromium (Debian's chromium and chromedriver) driven by Selenium.

Install: `apt-get install -y chromium chromium-driver` and `pip install selenium` (in the
dev extra). Selenium is pointed at both binaries, so it downloads nothing. Each browser gets
a fresh profile directory. Without the binaries the test is skipped, or fails where
GRPO_STREAM_REQUIRE_BROWSER is set (CI).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1800",
)
REQUIRE_ENV = "GRPO_STREAM_REQUIRE_BROWSER"
"""Set (CI): a missing browser fails the test instead of skipping it."""
SCREENSHOTS_ENV = "GRPO_STREAM_SCREENSHOTS"
"""A directory: the test saves its screenshots there (the docs' pictures come from it)."""


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium under Selenium; skips the test when either binary is missing."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        why = f"{', '.join(missing)} missing: apt-get install -y chromium chromium-driver"
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(why)
        pytest.skip(why)
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="grpo-stream-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(driver: Any, what: str, check: Callable[[Any], Any], timeout_s: float) -> Any:
    """The first truthy `check(driver)` within timeout_s; else fail naming `what`."""
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout_s, poll_frequency=0.2).until(check)
    except Exception as exc:  # selenium's TimeoutException, with the page's state
        phase = driver.execute_script("return document.getElementById('phase').textContent")
        raise AssertionError(f"{what} within {timeout_s:.0f}s (page phase: {phase})") from exc


def save_screenshot(driver: Any, name: str) -> None:
    """Save a PNG of the page to $GRPO_STREAM_SCREENSHOTS/NAME when that is set."""
    folder = os.environ.get(SCREENSHOTS_ENV)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / name))
