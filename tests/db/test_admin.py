"""The job admin's list and detail pages: what they show, how fast, and to whom."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from celery_idem.admin import JobAdmin, changelist, display
from celery_idem.admin.timeline import EVENT_LABELS
from celery_idem.backends import Change, Claimant, Intent, get_backend
from celery_idem.models import Job, Transition
from celery_idem.states import State
from tests.browser.jobs import make_job, populate

pytestmark = pytest.mark.django_db

LIST = "/admin/celery_idem/job/"


def detail(job: Job) -> str:
    return reverse("admin:celery_idem_job_change", args=[job.pk])


@pytest.fixture
def viewer(client, django_user_model):
    """A client logged in as staff who may only view jobs."""
    user = django_user_model.objects.create_user("viewer", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(user)
    return client


def keys(response) -> list[str]:
    return [job.key for job in response.context["cl"].result_list]


class TestJobList:
    def test_shows_key_task_state_badge_error_attempt_worker_and_update(self, viewer):
        """Each row has the key, task, a state badge with its name in words (with a
        failure's type and reason), the attempt, the worker and the last update."""
        jobs = populate()
        response = viewer.get(LIST)
        assert response.status_code == 200
        html = response.content.decode()
        row = html[html.index(">charge/order-1044<"):]
        row = row[:row.index("</tr>")]
        assert "shop.tasks.charge_card" in row
        assert '<span class="idem-state idem-state--failed">Failed</span>' in row
        assert ('<span class="idem-error-line" title="CardDeclined: card declined: '
                'insufficient funds (code 51)">') in row
        assert '<td class="field-attempt">2</td>' in row
        assert "celery@payments-2" in row and "30 min ago" in row
        assert "Running, stale claim" in html
        assert len(keys(response)) == len(jobs)

    def test_long_keys_and_names_are_cut_in_the_middle_and_whole_in_their_title(self, viewer):
        """A 64-character key shows its start and end around an ellipsis; its title, the
        task's and the namespace's hold them whole; the detail page shows the whole key."""
        key = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        job = make_job(key, State.SUCCEEDED)
        Job.objects.filter(pk=job.pk).update(namespace="billing.invoices.v2")
        html = viewer.get(LIST).content.decode()
        assert f'<span class="idem-short" title="{key}">9f86d081884c7d6…15b0f00a08</span>' in html
        assert ('<span title="shop.tasks.charge_card">shop.tasks.charge_card</span> · '
                '<span title="billing.invoices.v2">billing.invoices.v2</span>') in html
        assert f'<div class="readonly">{key}</div>' in viewer.get(detail(job)).content.decode()

    def test_newest_first(self, viewer):
        """The default order is by creation, newest first."""
        make_job("old", age=timedelta(hours=2))
        make_job("new", age=timedelta(minutes=1))
        make_job("middle", age=timedelta(hours=1))
        assert keys(viewer.get(LIST)) == ["new", "middle", "old"]

    def test_summary_counts_states_under_the_current_filter(self, viewer):
        """The summary counts jobs per state for the filter in force, with links per state."""
        populate()
        summary = {i["value"]: i["count"] for i in viewer.get(LIST).context["cl"].state_summary()}
        assert summary == {"PENDING": 2, "RUNNING": 2, "SUCCEEDED": 6, "FAILED": 2,
                           "UNCERTAIN": 1, "EXPIRED": 0}
        response = viewer.get(LIST, {"task_name": "shop.tasks.charge_card"})
        items = response.context["cl"].state_summary()
        assert {i["value"]: i["count"] for i in items} == {
            "PENDING": 0, "RUNNING": 1, "SUCCEEDED": 2, "FAILED": 1, "UNCERTAIN": 0,
            "EXPIRED": 0}
        failed = next(i for i in items if i["value"] == "FAILED")
        assert "state__exact=FAILED" in failed["url"] and "task_name=" in failed["url"]
        assert "4 jobs" in response.content.decode()

    def test_filters(self, viewer):
        """State, stale claim, dead-lettered, task name and date each narrow the list."""
        populate()
        assert set(keys(viewer.get(LIST, {"state__exact": "FAILED"}))) == {
            "charge/order-1044", "invoice/INV-2026-0193"}
        assert keys(viewer.get(LIST, {"claim": "stale"})) == ["export/2026-11-21"]
        assert keys(viewer.get(LIST, {"claim": "live"})) == ["charge/order-1045"]
        assert keys(viewer.get(LIST, {"dead_lettered": "yes"})) == ["invoice/INV-2026-0193"]
        assert "invoice/INV-2026-0193" not in keys(viewer.get(LIST, {"dead_lettered": "no"}))
        assert len(keys(viewer.get(LIST, {"task_name": "shop.tasks.ship_order"}))) == 4
        since = (timezone.now() - timedelta(hours=1)).isoformat()
        recent = keys(viewer.get(LIST, {"created_at__gte": since}))
        assert "invoice/INV-2026-0193" not in recent and "charge/order-1044" in recent

    def test_search_by_key_prefix_exact_key_and_task_id(self, viewer):
        """The search box takes a key, the start of a key, or a Celery task id."""
        jobs = populate()
        assert set(keys(viewer.get(LIST, {"q": "receipt/"}))) == {
            "receipt/order-1039", "receipt/order-1042"}
        assert keys(viewer.get(LIST, {"q": "ship/order-1043"})) == ["ship/order-1043"]
        assert keys(viewer.get(LIST, {"q": jobs["receipt"].task_id})) == ["receipt/order-1039"]
        assert keys(viewer.get(LIST, {"q": "order-1043"})) == []  # a prefix, not a substring
        assert keys(viewer.get(LIST, {"q": "Ship/"})) == []  # keys are case-sensitive

    def test_task_filter_offers_each_task_once(self, viewer):
        """The task filter's choices come from the task index, one per name, in order."""
        populate()
        spec = next(f for f in viewer.get(LIST).context["cl"].filter_specs
                    if getattr(f, "parameter_name", "") == "task_name")
        assert [name for name, _ in spec.lookup_choices] == [
            "billing.tasks.sync_invoice", "inventory.tasks.deduct_stock",
            "mail.tasks.send_receipt", "reports.tasks.nightly_export",
            "shop.tasks.charge_card", "shop.tasks.ship_order"]

    def test_query_count_does_not_grow_with_the_page(self, viewer):
        """Listing 5 or 50 jobs takes the same queries: no full count, no query per row."""
        for n in range(5):
            make_job(f"first/{n}", State.FAILED)
        with CaptureQueriesContext(connection) as five:
            assert len(keys(viewer.get(LIST))) == 5
        for n in range(45):
            make_job(f"more/{n}", [State.SUCCEEDED, State.RUNNING, State.PENDING][n % 3])
        with CaptureQueriesContext(connection) as fifty:
            assert len(keys(viewer.get(LIST))) == 50
        assert len(fifty.captured_queries) == len(five.captured_queries)
        counts = [q["sql"] for q in fifty.captured_queries if "COUNT(" in q["sql"].upper()]
        # Only the summary counts, one bounded (LIMIT) count per state; no full count.
        assert len(counts) == len(State) and all("LIMIT" in sql.upper() for sql in counts)

    def test_summary_caps_each_count(self, viewer, monkeypatch):
        """Past the cap a state shows "N+", and the total says "more than"."""
        monkeypatch.setattr(changelist, "COUNT_LIMIT", 3)
        for n in range(5):
            make_job(f"f/{n}", State.FAILED)
        make_job("s/1", State.SUCCEEDED)
        response = viewer.get(LIST)
        items = {i["value"]: i for i in response.context["cl"].state_summary()}
        assert (items["FAILED"]["count"], items["FAILED"]["capped"]) == (3, True)
        assert (items["SUCCEEDED"]["count"], items["SUCCEEDED"]["capped"]) == (1, False)
        html = response.content.decode()
        assert "more than 4 jobs" in html and '<span class="idem-summary-count">3+</span>' in html

    def test_counts_only_the_states_the_filter_admits(self, viewer):
        """Under "state = SUCCEEDED" (or a claim filter: RUNNING; dead-lettered: FAILED)
        the other states are 0 without a query of their own."""
        populate()
        for query, counted in [({"state__exact": "SUCCEEDED"}, "SUCCEEDED"),
                               ({"claim": "stale"}, "RUNNING"),
                               ({"dead_lettered": "yes"}, "FAILED")]:
            with CaptureQueriesContext(connection) as queries:
                response = viewer.get(LIST, query)
            summary = {i["value"]: i["count"] for i in response.context["cl"].state_summary()}
            assert {state for state, n in summary.items() if n} <= {counted}, query
            counts = [q for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
            assert len(counts) == 1, (query, counts)

    def test_under_a_search_the_states_of_a_sample_are_counted_as_lower_bounds(
            self, viewer, monkeypatch):
        """A key search is not served by the state indexes: one query counts the states
        of the first SAMPLE_LIMIT + 1 matches; past the cap every count shows "N+"."""
        monkeypatch.setattr(changelist, "SAMPLE_LIMIT", 3)
        for n in range(3):
            make_job(f"order/{n}", State.FAILED)
        make_job("order/9", State.SUCCEEDED)
        make_job("other/1", State.SUCCEEDED)
        with CaptureQueriesContext(connection) as queries:
            response = viewer.get(LIST, {"q": "order/"})
        items = {i["value"]: i for i in response.context["cl"].state_summary()}
        assert sum(i["count"] for i in items.values()) == 4
        assert all(i["capped"] for i in items.values() if i["count"])
        assert "more than" in response.content.decode()
        assert not [q for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
        monkeypatch.setattr(changelist, "SAMPLE_LIMIT", 10)
        items = {i["value"]: i for i in
                 viewer.get(LIST, {"q": "order/"}).context["cl"].state_summary()}
        assert (items["FAILED"]["count"], items["FAILED"]["capped"]) == (3, False)
        assert (items["SUCCEEDED"]["count"], items["SUCCEEDED"]["capped"]) == (1, False)

    def test_not_counted_in_full_and_sorted_only_by_indexed_columns(self):
        """The admin never counts the whole table, and sorts only where an index helps."""
        assert JobAdmin.show_full_result_count is False
        assert set(JobAdmin.sortable_by) == {"key_column"}  # newest first otherwise

    def test_no_add_change_or_delete(self, admin_client):
        """Jobs are records: even a superuser cannot add, edit or delete them here."""
        job = make_job("k", State.FAILED)
        assert admin_client.get(reverse("admin:celery_idem_job_add")).status_code == 403
        assert admin_client.post(detail(job), {"key": "other"}).status_code == 403
        assert admin_client.get(reverse("admin:celery_idem_job_delete", args=[job.pk])
                                ).status_code == 403
        actions = admin_client.get(LIST).context["action_form"].fields["action"].choices
        assert "delete_selected" not in dict(actions)
        assert Job.objects.get().key == "k"


class TestJobDetail:
    def test_read_only_page_with_history_checkpoints_json_and_traceback(self, viewer):
        """The detail page shows the timeline, checkpoints, JSON and a folded traceback."""
        jobs = populate()
        job = jobs["declined"]
        response = viewer.get(detail(job))
        assert response.status_code == 200
        html = response.content.decode()
        timeline = response.context["timeline"]
        assert [row["event"] for row in timeline] == [
            "published", "retry scheduled", "claimed", "failed"]
        # published and the second claim are read from the job row (no history rows).
        assert [row["derived"] for row in timeline] == [True, False, True, False]
        assert (timeline[2]["attempt"], timeline[2]["worker"]) == (2, "celery@payments-2")
        assert timeline[-1]["reason"] == "CardDeclined: card declined: insufficient funds (code 51)"
        assert timeline[-1]["worker"] == "celery@payments-2" and timeline[-1]["attempt"] == 2
        assert [c["step"] for c in response.context["checkpoints"]] == ["authorize"]
        assert "pi_3PqM4k2eZvKYlo2C0" in html
        assert '<pre class="idem-json">{\n  &quot;order_id&quot;: &quot;1044&quot;\n}</pre>' in html
        assert '<details class="idem-traceback"><summary>Traceback</summary>' in html
        assert "shop.payments.CardDeclined" in html
        assert job.fingerprint in html
        assert response.context["has_change_permission"] is False  # nothing to edit
        assert 'name="key"' not in html and "<textarea" not in html

    def test_happy_path_timeline_is_read_from_the_job_row(self, viewer):
        """published, claimed and succeeded record no history rows: the timeline shows
        them from the row's created, started and finished times, attempt and worker."""
        job = populate()["charged"]
        assert not job.transitions.exists()
        timeline = viewer.get(detail(job)).context["timeline"]
        assert [(row["event"], row["derived"]) for row in timeline] == [
            ("published", True), ("claimed", True), ("succeeded", True)]
        assert [row["at"] for row in timeline] == [
            display.full_time(t) for t in (job.created_at, job.started_at, job.finished_at)]
        assert {(row["attempt"], row["worker"]) for row in timeline[1:]} == {
            (1, "celery@payments-1")}

    def test_each_attempt_with_its_start_worker_and_end(self, viewer):
        """One line per attempt: when it started (the row's last claim, the history row
        that ended an earlier one), its worker, and the move that ended it with its
        reason."""
        job = make_job("invoice/1", State.FAILED, attempts=2, worker="celery@billing-1",
                       retried=["ConnectionError: ERP API returned 503"])
        runs = viewer.get(detail(job)).context["attempts"]
        assert [(r["attempt"], r["worker"], r["event"], r["reason"]) for r in runs] == [
            (1, "celery@billing-1", "retry scheduled", "ConnectionError: ERP API returned 503"),
            (2, "celery@billing-1", "failed",
             "CardDeclined: card declined: insufficient funds (code 51)"),
        ]
        first_claim = job.created_at + timedelta(milliseconds=150)  # as make_job claims
        assert [r["started"] for r in runs] == [display.full_time(first_claim),
                                                display.full_time(job.started_at)]
        assert [r["ran"] for r in runs] == ["2.0 s", "2.0 s"]
        assert "Pending" in runs[0]["to"] and "Failed" in runs[1]["to"]

    @pytest.mark.parametrize("ended", ["released", "taken_over"])
    def test_released_or_taken_over_then_claimed_again_and_succeeding_shows_both_starts(
            self, viewer, ended):
        """A fresh key claimed, its claim released (or taken over after its lease
        expired), claimed again and succeeding: both attempts' starts, the first the
        first claim's started_at, kept by the history row that ended it."""
        backend = get_backend("default")
        first_at = timezone.now() - timedelta(minutes=5)
        intent = Intent("ns", "report/7", "shop.tasks.report", "fp", [], {}, {})
        job_id = backend.publish(intent, "t-0", first_at).row.id
        backend.claim("claimed", intent, Claimant("w/1", "t-1", first_at,
                                                  first_at + timedelta(seconds=60)))
        first = Job.objects.get(pk=job_id).started_at
        now = timezone.now()
        if ended == "released":
            assert backend.apply(Change(job_id, "released", State.RUNNING, attempt=1,
                                        values={"lease_expires_at": None}), now)
            assert backend.claim("claimed", intent, Claimant(
                "w/2", "t-2", now, now + timedelta(seconds=60))).won
        else:
            assert backend.claim("taken_over", intent, Claimant(
                "w/2", "t-2", now, now + timedelta(seconds=60))).won
        assert backend.apply(Change(job_id, "succeeded", State.RUNNING, attempt=2,
                                    values={"result": 1, "finished_at": timezone.now(),
                                            "lease_expires_at": None}), timezone.now())
        job = Job.objects.get(pk=job_id)
        runs = viewer.get(detail(job)).context["attempts"]
        assert [r["started"] for r in runs] == [display.full_time(first_at),
                                                display.full_time(job.started_at)]
        assert first == first_at and job.started_at == now
        assert [r["event"] for r in runs] == [EVENT_LABELS[ended], EVENT_LABELS["succeeded"]]
        assert all(r["ran"] for r in runs)
        assert b"not recorded" not in viewer.get(detail(job)).content

    def test_an_attempt_whose_end_does_not_keep_its_start_shows_it_unknown(self, viewer):
        """A history row without the ended attempt's start (none is written so; a row
        written by hand here) leaves it unknown; the take-over's own row still gives the
        new attempt's start and worker, and the lost attempt ends there (its worker was
        the row's, which the take-over replaced)."""
        job = make_job("export/1", State.RUNNING, stale=True, worker="celery@reports-1")
        took = timezone.now()
        Job.objects.filter(pk=job.pk).update(attempt=2, worker="celery@reports-2",
                                             started_at=took)
        Transition.objects.create(job=job, event="taken_over", from_state=State.RUNNING,
                                  to_state=State.RUNNING, attempt=2, worker="celery@reports-2",
                                  at=took)
        first, second = viewer.get(detail(job)).context["attempts"]
        assert (first["worker"], first["event"], first["ended"]) == (
            "", "taken over", display.full_time(took))
        assert (second["worker"], second["started"], second["running"]) == (
            "celery@reports-2", display.full_time(took), True)
        assert first["started"] == ""
        assert b"not recorded" in viewer.get(detail(job)).content

    def test_a_success_and_a_running_attempt_read_from_the_row(self, viewer):
        jobs = populate()
        [run] = viewer.get(detail(jobs["charged"])).context["attempts"]
        assert (run["event"], run["ran"], run["worker"]) == (
            "succeeded", "1.3 s", "celery@payments-1")
        [run] = viewer.get(detail(jobs["charging"])).context["attempts"]
        assert run["running"] and run["ended"] == "" and run["started"]
        assert viewer.get(detail(jobs["queued"])).context["attempts"] == []

    def test_re_sends_and_the_send_time_read_right(self, viewer):
        """A sent job is "not re-sent", not "0 dispatches"; re-sends are counted; an
        intent whose message has not left says so."""
        job = make_job("k", State.PENDING)
        html = viewer.get(detail(job)).content.decode()
        assert "Re-sent:" in html and "not re-sent" in html and "Dispatches" not in html
        assert display.full_time(job.sent_at) in html
        Job.objects.filter(pk=job.pk).update(dispatch_count=3)
        assert "re-sent 3 times" in viewer.get(detail(job)).content.decode()
        Job.objects.filter(pk=job.pk).update(dispatch_count=1, sent_at=None)
        html = viewer.get(detail(job)).content.decode()
        assert "re-sent 1 time<" in html and "not sent yet" in html

    def test_result_shown_and_arguments_not_stored(self, viewer):
        """A result is pretty-printed; arguments not stored say so instead of looking empty."""
        job = make_job("k", State.SUCCEEDED, result={"charge_id": "ch_1"})
        Job.objects.filter(pk=job.pk).update(args=None, kwargs=None)
        html = viewer.get(detail(job)).content.decode()
        assert "&quot;charge_id&quot;: &quot;ch_1&quot;" in html
        assert "not stored (CELERY_IDEM_STORE_ARGUMENTS is off)" in html

    def test_links_the_task_result_when_django_celery_results_is_installed(self, viewer,
                                                                           monkeypatch):
        """With django-celery-results, the task id links to its TaskResult by task_id."""
        from django.apps import apps

        job = make_job("k", State.SUCCEEDED)
        installed = apps.is_installed("django_celery_results")
        html = viewer.get(detail(job)).content.decode()
        assert ("taskresult/?task_id=" in html) == installed
        if not installed:
            monkeypatch.setattr(apps, "is_installed",
                                lambda name: name == "django_celery_results")
            monkeypatch.setattr("celery_idem.admin.display.reverse",
                                lambda name: "/admin/django_celery_results/taskresult/")
            html = viewer.get(detail(job)).content.decode()
        assert f'href="/admin/django_celery_results/taskresult/?task_id={job.task_id}"' in html

    def test_buttons_only_for_permitted_actions_that_apply(self, client, django_user_model):
        """A viewer sees no action buttons; an operator sees those the job's state allows."""
        failed, running = make_job("f", State.FAILED), make_job("r", State.RUNNING)
        user = django_user_model.objects.create_user("op", is_staff=True)
        user.user_permissions.add(*Permission.objects.filter(
            codename__in=["view_job", "retry_job", "forget_job"]))
        client.force_login(user)

        def buttons(job):
            return [a["name"] for a in client.get(detail(job)).context["job_actions"]]

        assert buttons(failed) == ["retry_selected", "forget_selected"]
        assert buttons(running) == []  # release needs release_job; a running job can't be forgotten
        user.user_permissions.remove(*Permission.objects.exclude(codename="view_job"))
        user = django_user_model.objects.get(pk=user.pk)
        client.force_login(user)
        assert buttons(failed) == []

    def test_staff_without_view_permission_is_refused(self, client, django_user_model):
        """Seeing jobs at all needs the view permission."""
        job = make_job("k", State.FAILED)
        client.force_login(django_user_model.objects.create_user("nobody", is_staff=True))
        assert client.get(LIST).status_code == 403
        assert client.get(detail(job)).status_code == 403
