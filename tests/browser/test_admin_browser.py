"""The job admin in a real browser: find a failed job, read its history, retry it."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission

from celery_idem.models import Job
from celery_idem.states import State

from .jobs import populate

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
    """Save the whole page (not only the window) as a PNG, through the DevTools protocol."""
    import base64

    metrics = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
    size = metrics.get("cssContentSize") or metrics["contentSize"]
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
    })
    path.write_bytes(base64.b64decode(shot["data"]))


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


def test_find_read_and_retry_a_failed_job(browser, live_server, transactional_db, operator,
                                          payments_queue, screenshots):
    """Log in, filter to FAILED, open a job, see its timeline, retry it: it is PENDING."""
    from selenium.webdriver.common.by import By

    jobs = populate()
    declined = jobs["declined"]
    driver = browser
    driver.delete_all_cookies()

    driver.get(f"{live_server.url}/admin/login/?next=/admin/celery_idem/job/")
    driver.find_element(By.NAME, "username").send_keys("operator")
    driver.find_element(By.NAME, "password").send_keys(PASSWORD)
    driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_for(lambda: driver.find_element(By.CSS_SELECTOR, ".idem-summary"), "the job list")
    # Fold the admin's app sidebar so the screenshots show the whole table.
    driver.execute_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    driver.refresh()
    wait_for(lambda: driver.find_element(By.CSS_SELECTOR, ".idem-summary"), "the job list")
    rows = driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == len(jobs)
    page_shot(driver, screenshots / "admin-list.png")

    failed_filter = "#changelist-filter a[href*='state__exact=FAILED']"
    driver.find_element(By.CSS_SELECTOR, failed_filter).click()
    wait_for(lambda: "state__exact=FAILED" in driver.current_url, "the FAILED filter")
    rows = wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr"),
                    "the filtered rows")
    states = {r.find_element(By.CSS_SELECTOR, ".idem-state").text.lower() for r in rows}
    assert states == {"failed"}
    assert len(rows) == Job.objects.filter(state=State.FAILED).count() == 2

    driver.find_element(By.LINK_TEXT, declined.key).click()
    timeline = wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, ".idem-timeline-row"),
                        "the job's history")
    events = [row.find_elements(By.TAG_NAME, "td")[1].text for row in timeline]
    # published and the last claim are read from the job row; the rest are history rows.
    assert events == ["published (job row)", "retry scheduled", "claimed (job row)", "failed"]
    assert "CardDeclined: card declined" in timeline[-1].text
    assert "celery@payments-2" in timeline[-1].text
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
