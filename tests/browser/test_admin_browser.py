"""The job admin in a real browser, in a laptop's window: the whole list fits beside the
sidebar; find a failed job, read its history and attempts, retry it."""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission

from celery_idem.admin import display
from celery_idem.fingerprints import fingerprint
from celery_idem.models import Job
from celery_idem.states import State

from .conftest import LAPTOP
from .jobs import make_job, populate

#: Seconds to wait for a page to show what the test expects (the machine may be busy).
DEADLINE = 30.0
PASSWORD = "correct horse battery staple"


def wait_for(check: Any, what: str, deadline: float = DEADLINE) -> Any:
    """Poll ``check()`` until it returns something truthy, or fail after ``deadline``."""
    end = time.monotonic() + deadline
    while True:
        with contextlib.suppress(Exception):
            value = check()
            if value:
                return value
        if time.monotonic() > end:
            pytest.fail(f"timed out after {deadline:.0f}s waiting for {what}")
        time.sleep(0.1)


def page_shot(driver: Any, path: Path) -> None:
    """Save the whole page (not only the window) as a PNG, through the DevTools protocol;
    in 64 colours where Pillow is installed (the docs' screenshots stay small)."""
    import base64
    import io

    metrics = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
    size = metrics.get("cssContentSize") or metrics["contentSize"]
    # A window as tall as the page, so the sticky sidebar stays at its top.
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": round(size["width"]), "height": round(size["height"]),
        "deviceScaleFactor": 1, "mobile": False})
    try:
        shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    png = base64.b64decode(shot["data"])
    try:
        from PIL import Image
    except ImportError:
        path.write_bytes(png)
        return
    Image.open(io.BytesIO(png)).convert("RGB").quantize(
        64, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)


@pytest.fixture
def operator(django_user_model: Any) -> Any:
    """A staff user who may view jobs and run every operator action."""
    user = django_user_model.objects.create_user("operator", password=PASSWORD, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(
        content_type__app_label="celery_idem",
        codename__in=["view_job", "retry_job", "release_job", "resolve_job", "forget_job"]))
    return user


@pytest.fixture
def payments_queue() -> Any:
    """The queue the retried job is sent to; nothing consumes it, so empty it afterwards."""
    yield "payments"
    from django_app.celery import app

    with contextlib.suppress(Exception), app.connection_for_write() as conn:
        conn.default_channel.queue_purge("payments")


def log_in(driver: Any, live_server: Any) -> None:
    """Log the operator in and open the job list, with the admin's sidebar as it comes."""
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(f"{live_server.url}/admin/login/?next=/admin/celery_idem/job/")
    driver.execute_script("localStorage.clear()")  # the sidebar open, as Django starts it
    driver.find_element(By.NAME, "username").send_keys("operator")
    driver.find_element(By.NAME, "password").send_keys(PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_for(lambda: driver.find_element(By.CSS_SELECTOR, ".idem-summary"), "the job list")


#: Where each header and cell of the list lies, and the parts of the page that bound it.
BOXES = """
const box = e => { const r = e.getBoundingClientRect();
                   return {left: r.left, right: r.right, text: e.innerText.trim()}; };
const results = document.querySelector('#changelist .results');
return {
  viewport: document.documentElement.clientWidth,
  pageWidth: document.documentElement.scrollWidth,
  results: box(results), overflow: results.scrollWidth - results.clientWidth,
  sidebar: box(document.querySelector('#nav-sidebar')),
  cells: [...document.querySelectorAll('#result_list th, #result_list td')].map(
    e => ({...box(e), name: e.className, cut: e.scrollWidth > e.clientWidth})),
};
"""


def test_the_whole_list_fits_a_laptop_beside_the_sidebar(browser, live_server, transactional_db,
                                                          operator, screenshots):
    """At 1440 px with Django's sidebar open, every header and cell lies within the
    window and the list's box: nothing to scroll to. A fingerprint key is cut, whole in
    its title; each failed job shows its error's type and reason."""
    from selenium.webdriver.common.by import By

    jobs = populate()
    newsletter = {"list": "customers-nl", "issue": "2026-11"}
    long_key = fingerprint([[], newsletter])
    jobs["newsletter"] = make_job(long_key, State.SUCCEEDED, kwargs=newsletter,
                                  task_name="marketing.newsletters.tasks.send_issue",
                                  worker="celery@ip-10-0-12-34.eu-west-1.compute.internal")
    driver = browser
    log_in(driver, live_server)

    assert driver.execute_script("return window.innerWidth") == LAPTOP[0]
    page = driver.execute_script(BOXES)
    assert page["sidebar"]["right"] > 200  # the sidebar is open beside the list
    assert page["pageWidth"] <= page["viewport"] and page["overflow"] <= 0, page
    assert len(page["cells"]) == (len(jobs) + 1) * 6  # the checkbox and 5 columns
    for cell in page["cells"]:
        assert page["results"]["left"] <= cell["left"], cell
        assert cell["right"] <= min(page["results"]["right"], page["viewport"]), cell
        # What the server cut is whole in its title; the columns cut nothing more.
    assert [(c["name"], c["text"]) for c in page["cells"] if c["cut"]] == []
    headers = [c["text"] for c in page["cells"][1:6]]
    assert headers == ["KEY AND TASK", "STATE", "ATTEMPT", "WORKER", "LAST UPDATE"]

    short = driver.find_element(By.CSS_SELECTOR, f".field-key_column [title='{long_key}']")
    assert short.text == f"{long_key[:15]}…{long_key[-10:]}"
    failed = [row for row in driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
              if row.find_element(By.CSS_SELECTOR, ".idem-state").text == "FAILED"]
    errors = {row.find_element(By.CSS_SELECTOR, "th a span").get_attribute("title"):
              row.find_element(By.CSS_SELECTOR, ".idem-error-line") for row in failed}
    assert set(errors) == {"charge/order-1044", "invoice/INV-2026-0193"}
    declined = errors["charge/order-1044"]
    assert declined.is_displayed() and declined.text.startswith("CardDeclined: card declined")
    assert declined.get_attribute("title") == (
        "CardDeclined: card declined: insufficient funds (code 51)")
    assert errors["invoice/INV-2026-0193"].text.startswith("ConnectionError: ERP API")
    page_shot(driver, screenshots / "admin-list.png")


def test_find_read_and_retry_a_failed_job(browser, live_server, transactional_db, operator,
                                          payments_queue, screenshots):
    """Log in, filter to FAILED, open a job, see its timeline and attempts, retry it: it
    is PENDING."""
    from selenium.webdriver.common.by import By

    jobs = populate()
    declined = jobs["declined"]
    driver = browser
    log_in(driver, live_server)
    rows = driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == len(jobs)

    failed_filter = "#changelist-filter a[href*='state__exact=FAILED']"
    driver.find_element(By.CSS_SELECTOR, failed_filter).click()
    wait_for(lambda: "state__exact=FAILED" in driver.current_url, "the FAILED filter")
    rows = wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr"),
                    "the filtered rows")
    states = {r.find_element(By.CSS_SELECTOR, ".idem-state").text.lower() for r in rows}
    assert states == {"failed"}
    assert len(rows) == Job.objects.filter(state=State.FAILED).count() == 2

    driver.find_element(By.CSS_SELECTOR, f"th a span[title='{declined.key}']").click()
    timeline = wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, ".idem-timeline-row"),
                        "the job's history")
    events = [row.find_elements(By.TAG_NAME, "td")[1].text for row in timeline]
    # published and the last claim are read from the job row; the rest are history rows.
    assert events == ["published (job row)", "retry scheduled", "claimed (job row)", "failed"]
    assert "CardDeclined: card declined" in timeline[-1].text
    assert "celery@payments-2" in timeline[-1].text
    runs = [[td.text for td in row.find_elements(By.TAG_NAME, "td")]
            for row in driver.find_elements(By.CSS_SELECTOR, ".idem-attempt-row")]
    assert [(run[0], run[2], run[4]) for run in runs] == [
        ("1", "celery@payments-2", "2.4 s"), ("2", "celery@payments-2", "2.4 s")]
    # Each attempt's start: the first kept by the retry that ended it, the last the row's.
    first_claim = declined.created_at + timedelta(milliseconds=150)  # as make_job claims
    assert [run[1] for run in runs] == [display.full_time(first_claim),
                                        display.full_time(declined.started_at)]
    assert runs[0][5].startswith("retry scheduled PENDING")
    assert runs[1][5].startswith("failed FAILED\nCardDeclined: card declined")
    traceback = driver.find_element(By.CSS_SELECTOR, "details.idem-traceback")
    assert traceback.get_attribute("open") is None  # folded until asked for
    traceback.find_element(By.TAG_NAME, "summary").click()
    wait_for(lambda: "shop/payments.py" in traceback.text, "the unfolded traceback")
    page_shot(driver, screenshots / "admin-detail.png")

    driver.find_element(By.CSS_SELECTOR, "button.idem-action--retry_selected").click()
    message = wait_for(lambda: driver.find_element(By.CSS_SELECTOR, ".messagelist .success"),
                       "the success message")
    assert "pending again" in message.text and declined.key in message.text
    state = driver.find_element(By.CSS_SELECTOR, ".field-state_display .idem-state")
    assert state.text.lower() == "pending"
    assert f"/{declined.pk}/change/" in driver.current_url
    last = driver.find_elements(By.CSS_SELECTOR, ".idem-timeline-row")[-1].text
    assert "reset by an operator" in last and "operator" in last

    declined.refresh_from_db()
    assert declined.state == State.PENDING
    reset = declined.transitions.get(event="reset")
    assert (reset.from_state, reset.to_state, reset.actor) == ("FAILED", "PENDING", "operator")
