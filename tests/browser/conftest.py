"""A headless Chromium driven by Selenium, for tests against pytest-django's live server.

It uses the Chromium and chromedriver that Debian installs (``.ci/run`` installs them) and
never downloads a browser. Missing ones skip the tests locally and fail them in CI.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI

CHROMIUM = os.environ.get("IDEM_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("IDEM_CHROMEDRIVER", "/usr/bin/chromedriver")
#: A laptop's window (the admin must fit it with Django's sidebar open), in CSS pixels.
LAPTOP = (1440, 900)
#: The network is closed: no first-run pings, updates, sync or QUIC.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--force-device-scale-factor=1",
         "--lang=en-US"]


def _unavailable(message: str) -> None:
    if IN_CI:
        pytest.fail(f"{message}; CI must run the browser tests", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One headless Chromium for the session, with a fresh profile."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _unavailable("selenium is not installed (pip install selenium)")
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).is_file():
            _unavailable(f"{path} is missing (apt-get install chromium chromium-driver)")
    profile = tempfile.mkdtemp(prefix="idem-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_window_size(*LAPTOP)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    """Where screenshots go: ``IDEM_ADMIN_SCREENSHOTS`` (e.g. ``docs/images``) or a temp folder."""
    folder = Path(os.environ.get("IDEM_ADMIN_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder
