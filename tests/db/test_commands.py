"""The operations commands: idem_status, idem_reap, idem_retry and idem_purge."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from freezegun import freeze_time

from celery_idem import actions, claims
from celery_idem.models import Checkpoint, Job, Transition
from celery_idem.producer import KEY_HEADER as HEADER
from celery_idem.producer import write_intent
from celery_idem.recovery import sweep as reaper
from django_app.effects.models import Effect
from django_app.effects.tasks import always_fails, ship_order

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sent(monkeypatch):
    """Task ids sent by the commands (reaper and operator retry), instead of the broker."""
    ids: list[str] = []

    def fake(job, countdown=None, task_id=None, fresh=False):
        ids.append(task_id or f"op-{job.key}")
        return ids[-1]

    monkeypatch.setattr(reaper, "redispatch", fake)
    monkeypatch.setattr(actions, "redispatch", fake)
    return ids


def cmd(name, *args):
    out = StringIO()
    call_command(name, *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def run(task, *args):
    """Execute one message of ``task`` in this process, as a worker would."""
    return task.apply(args=args, headers={HEADER: task.intent(args, {}).key})


def job_in(state, n, task=ship_order, lease=3600):
    """A job of ``task`` for argument ``n``, left in ``state``."""
    intent = task.intent((n,), {})
    write_intent(intent, f"pub-{n}")
    if state == "PENDING":
        return Job.objects.get(key=intent.key)
    _, claim = claims.acquire(intent, worker="h/1", task_id=f"t-{n}", lease_seconds=lease,
                              using="default")
    if state == "SUCCEEDED":
        claim.succeed(n)
    elif state == "FAILED":
        claim.fail(ValueError(f"boom {n}"))
    return Job.objects.get(key=intent.key)


class TestStatus:
    def test_counts_per_task_and_state_and_what_needs_attention(self):
        """The table has the counts; stale claims and the oldest claim are reported."""
        job_in("SUCCEEDED", 1)
        job_in("FAILED", 2)
        job_in("RUNNING", 3, lease=0)
        out = cmd("idem_status")
        row = next(line for line in out.splitlines() if line.startswith(ship_order.name))
        assert row.split()[1:] == ["0", "1", "1", "1", "0", "0"]
        assert "Oldest running claim: job" in out and "ship/3" in out
        assert "Stale claims (lease expired): 1" in out

    def test_json_output_for_scripts(self):
        """--json gives the same facts as data."""
        job_in("RUNNING", 3, lease=0)
        status = json.loads(cmd("idem_status", "--json"))
        assert status["counts"] == {ship_order.name: {"RUNNING": 1}}
        assert status["stale_claims"] == {ship_order.name: 1}
        assert status["oldest_running"]["key"] == "ship/3"

    def test_estimates_are_marked_and_exact_counts_them(self):
        """On PostgreSQL once analysed, SUCCEEDED is an estimate marked ~ (and listed in
        --json); --exact counts it. Elsewhere every count is exact."""
        from django.db import connection
        job_in("SUCCEEDED", 1)
        job_in("FAILED", 2)
        estimated = connection.vendor == "postgresql"
        if estimated:
            with connection.cursor() as cursor:
                cursor.execute(f"ANALYZE {Job._meta.db_table}")
        row = next(line for line in cmd("idem_status").splitlines()
                   if line.startswith(ship_order.name))
        assert row.split()[1:] == ["0", "0", "~1" if estimated else "1", "1", "0", "0"]
        assert json.loads(cmd("idem_status", "--json"))["estimated"] == (
            [[ship_order.name, "SUCCEEDED"]] if estimated else [])
        exact = cmd("idem_status", "--exact")
        assert "~" not in exact and "estimated" not in exact

    def test_an_unknown_task_is_a_clear_error(self):
        """A misspelt --task names the close match instead of printing zeros."""
        job_in("PENDING", 1)
        with pytest.raises(CommandError, match="did you mean .*ship_order"):
            cmd("idem_status", "--task", "django_app.effects.tasks.ship_ordr")


class TestReap:
    def test_prints_what_the_pass_did(self, sent):
        """One stale claim: released and sent again, per task."""
        job_in("RUNNING", 1, lease=0)
        out = cmd("idem_reap")
        assert f"released: 1 ({ship_order.name}: 1)" in out and len(sent) == 1

    def test_nothing_to_do(self, sent):
        """An empty table: a clear line, nothing sent."""
        assert "Nothing to do" in cmd("idem_reap") and sent == []

    def test_a_bad_batch_size_is_refused(self):
        """--batch-size 0 is an error, not an endless loop."""
        with pytest.raises(CommandError, match="--batch-size must be greater than 0"):
            cmd("idem_reap", "--batch-size", "0")


class TestRetry:
    def test_dry_run_lists_and_changes_nothing(self, sent):
        """--dry-run prints the matching FAILED jobs and leaves them FAILED."""
        job_in("FAILED", 1)
        out = cmd("idem_retry", "--task", ship_order.name, "--dry-run")
        assert "would retry job" in out and "1 job(s) would be retried" in out
        assert Job.objects.get(key="ship/1").state == "FAILED" and sent == []

    def test_filters_by_key_prefix_and_reason(self, sent):
        """Only FAILED jobs whose key and failure reason match are reset and sent."""
        job_in("FAILED", 10)
        job_in("FAILED", 20)
        job_in("SUCCEEDED", 11)
        out = cmd("idem_retry", "--key-prefix", "ship/1", "--reason", "BOOM 10")
        assert "1 job(s) retried" in out and len(sent) == 1
        states = dict(Job.objects.values_list("key", "state"))
        assert states == {"ship/10": "PENDING", "ship/20": "FAILED", "ship/11": "SUCCEEDED"}
        reset = Transition.objects.get(job__key="ship/10", event="reset")
        assert reset.actor.startswith("idem_retry")

    def test_a_retried_dead_lettered_job_runs_again(self, sent):
        """A reset gives the key a fresh budget: the next message runs instead of dead-lettering."""
        job = job_in("FAILED", 5)
        Job.objects.filter(pk=job.pk).update(attempt=9)  # far past max_attempts
        cmd("idem_retry", "--task", ship_order.name)
        assert run(ship_order, 5).get() == {"shipped": 5, "attempt": 10}
        assert Job.objects.get(pk=job.pk).state == "SUCCEEDED"

    @pytest.mark.parametrize("args,message", [
        ((), "refusing to retry every job without a filter"),
        (("--task", "no.such.task"), "no idempotent task named 'no.such.task'"),
        (("--key-prefix", " "), "--key-prefix must not be empty"),
        (("--reason", ""), "--reason must not be empty"),
        (("--all", "--limit", "-1"), "--limit must be greater than 0"),
    ])
    def test_bad_filters_are_clear_errors(self, args, message):
        """Each bad filter names itself in a CommandError."""
        with pytest.raises(CommandError, match=message):
            cmd("idem_retry", *args)


class TestPurge:
    def test_deletes_only_what_the_retention_says(self):
        """Finished jobs older than the retention go, with history; the rest stays."""
        with freeze_time("2030-01-01"):
            old_ok, old_failed = job_in("SUCCEEDED", 1), job_in("FAILED", 2)
            job_in("RUNNING", 3)
            job_in("PENDING", 4)
            Checkpoint.objects.create(job=old_ok, step="s", attempt=1)
        with freeze_time("2030-02-20"):
            job_in("SUCCEEDED", 5)
        with freeze_time("2030-03-01"):
            out = cmd("idem_purge", "--older-than", "30", "--batch-size", "1")
        assert "deleted 2 job(s)" in out and "1 checkpoint(s)" in out
        assert sorted(Job.objects.values_list("key", flat=True)) == ["ship/3", "ship/4", "ship/5"]
        assert not Transition.objects.filter(job_id__in=[old_ok.pk, old_failed.pk]).exists()

    def test_state_filter_and_dry_run(self):
        """--state FAILED with --dry-run counts the failed jobs and deletes nothing."""
        with freeze_time("2030-01-01"):
            job_in("SUCCEEDED", 1)
            job_in("FAILED", 2)
        with freeze_time("2030-03-01"):
            out = cmd("idem_purge", "--state", "FAILED", "--dry-run")
        assert "would delete 1 job(s)" in out and Job.objects.count() == 2

    def test_a_retried_key_can_run_again_after_being_forgotten(self, sent):
        """Fail, retry, succeed, purge: the same key then runs its body once more."""
        with freeze_time("2030-01-01"):
            always_fails.delay(7)
            run(always_fails, 7)
            cmd("idem_retry", "--task", always_fails.name)
            run(always_fails, 7)
            Job.objects.filter(key="fail/7").update(finished_at=timezone.now())
        assert Effect.objects.filter(key="fail/7").count() == 2
        with freeze_time("2030-03-01"):
            assert "deleted 1 job(s)" in cmd("idem_purge", "--older-than", "30")
        always_fails.delay(7)
        run(always_fails, 7)
        assert Effect.objects.filter(key="fail/7").count() == 3
        assert Transition.objects.filter(job__key="fail/7", event="reset").count() == 0

    @pytest.mark.parametrize("args,message", [
        (("--older-than", "0"), "--older-than must be greater than 0"),
        (("--batch-size", "-5"), "--batch-size must be greater than 0"),
        (("--task", "no.such.task"), "no idempotent task named"),
    ])
    def test_bad_filters_are_clear_errors(self, args, message):
        """Each bad option names itself in a CommandError."""
        with pytest.raises(CommandError, match=message):
            cmd("idem_purge", *args)


def test_status_shows_lost_messages_and_dead_letters():
    """A PENDING job past the dispatch timeout and a dead-lettered one are both counted."""
    with freeze_time("2030-01-01"):
        job_in("PENDING", 1)
    with freeze_time("2030-01-01 01:00"):
        status = json.loads(cmd("idem_status", "--json"))
    assert status["lost_messages"] == {ship_order.name: 1}
    job = job_in("RUNNING", 2)
    claims.Claim(claims.get_backend("default"), job.id, job.attempt, "h/1", "t-2", 60).fail(
        ValueError("x"), "dead_lettered", "dead-lettered")
    assert json.loads(cmd("idem_status", "--json"))["dead_lettered"] == {ship_order.name: 1}
