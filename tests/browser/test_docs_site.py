"""The documentation site as a reader gets it: built with warnings as errors, served over
HTTP, opened in headless Chromium. The API reference shows ``IdempotentTask`` with its
documented options, and the site's search (which runs in the browser) finds PgBouncer."""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import _unavailable

ROOT = Path(__file__).resolve().parents[2]
#: The options IdempotentTask's docstring documents, as the reference must show them.
OPTIONS = ("idempotency_key", "idempotency_namespace", "atomic", "atomic_database",
           "on_in_progress", "on_stale_claim", "max_attempts", "lease")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The site built from this checkout into a temporary folder and served on a free
    port; its base URL."""
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        _unavailable("mkdocs is not installed (pip install -e '.[docs]')")
    folder = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir",
         str(folder)], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stderr}"
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_the_api_reference_shows_idempotent_task_and_its_options(browser: Any,
                                                                   site: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{site}/reference/api/")
    heading = browser.find_element(By.ID, "celery_idem.IdempotentTask")
    assert "IdempotentTask" in heading.text
    section = heading.find_element(By.XPATH, "following-sibling::div[1]")
    shown = section.text
    missing = [option for option in OPTIONS if option not in shown]
    assert missing == [], f"the reference does not show {missing}"
    assert "heartbeat" in shown and "external_key" in shown and "step" in shown


def test_the_sites_search_finds_pgbouncer(browser: Any, site: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{site}/")
    query = WebDriverWait(browser, 30).until(ready.element_to_be_clickable(
        (By.CSS_SELECTOR, "input[data-md-component='search-query']")))
    query.click()
    query.send_keys("PgBouncer")
    # The index loads in a web worker; the results list fills once it has answered.
    WebDriverWait(browser, 60).until(lambda driver: driver.find_elements(
        By.CSS_SELECTOR, ".md-search-result__item"))
    results = browser.find_elements(By.CSS_SELECTOR, ".md-search-result__item")
    titles = " ".join(result.text for result in results)
    assert "PgBouncer" in titles
    links = [a.get_attribute("href") for a in browser.find_elements(
        By.CSS_SELECTOR, ".md-search-result__item a")]
    assert any(link and "/how-to/pgbouncer/" in link for link in links), links
