"""A recovery pass as a whole: it walks every batch, builds the message from the stored
job, runs beside another pass, moves a batch in one backend step, and costs no more for
jobs of tasks this process does not know."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.utils import timezone
from freezegun import freeze_time

from celery_idem.backends import Change
from celery_idem.errors import InvalidTransition
from celery_idem.models import Job, Transition
from celery_idem.producer import KEY_HEADER as HEADER
from celery_idem.recovery import resend as dispatch
from celery_idem.recovery import sweep as reaper
from celery_idem.states import State
from django_app.effects.tasks import ship_order
from tests.db.reaping import T0, claim, publish, reap_at
from tests.db.reaping import sent as sent
from tests.db.reaping import timeouts as timeouts

pytestmark = pytest.mark.django_db(transaction=True)


class TestBatches:
    def test_a_pass_walks_every_batch(self, backend, sent):
        """Seven stale claims with a batch size of three: all released in one pass."""
        with freeze_time(T0):
            for n in range(7):
                claim(publish(n=n), task_id=f"t-{n}")
        report = reap_at("2030-01-01 13:00:00", batch_size=3)
        assert report.total("released") == 7 and len(sent) == 7
        assert set(Job.objects.values_list("state", flat=True)) == {"PENDING"}

    def test_re_dispatch_uses_the_stored_arguments_key_and_routing(self, backend, monkeypatch):
        """The message carries the stored args, the key header, the queue and priority."""
        calls = []
        monkeypatch.setattr(dispatch.current_app, "send_task",
                            lambda name, **kw: calls.append((name, kw)))
        with freeze_time(T0):
            claim(publish(n=5, options={"queue": "orders", "priority": 7}))
        reap_at("2030-01-01 13:00:00")
        (name, kwargs), = calls
        job = Job.objects.get(key="ship/5")
        assert name == ship_order.name
        assert (kwargs["args"], kwargs["kwargs"], kwargs["headers"]) == \
            ([5], {}, {HEADER: "ship/5"})
        assert (kwargs["queue"], kwargs["priority"], kwargs["task_id"]) == \
            ("orders", 7, job.task_id)


def test_two_concurrent_passes_release_each_stale_claim_once(backend, sent):
    """Two passes at once over 120 stale claims: each released and sent exactly once."""
    _two_concurrent_passes(sent)


def test_without_skip_locked_two_passes_wait_for_each_other_and_release_each_once(
        backend, sent, monkeypatch):
    """MariaDB < 10.6 and MySQL < 8.0.1 have no SKIP LOCKED: the batch is taken with a
    plain FOR UPDATE, so a concurrent pass waits for it instead of skipping it, and then
    finds those rows no longer stale. Run on MariaDB with the feature turned off."""
    if connection.vendor != "mysql":
        pytest.skip("the FOR UPDATE fallback is for MySQL/MariaDB servers without SKIP LOCKED")
    # Every thread's connection gets new features: patch the class.
    monkeypatch.setattr(type(connection.features), "has_select_for_update_skip_locked", False)
    _two_concurrent_passes(sent)


def _two_concurrent_passes(sent):
    for n in range(120):
        claim(publish(n=n), task_id=f"t-{n}")
    start = threading.Barrier(2)
    reports, errors = [], []

    def one_pass():
        try:
            start.wait()
            reports.append(reaper.reap(now=timezone.now() + timedelta(days=1), batch_size=10))
        except Exception as exc:  # surfaced below: a thread cannot fail the test itself
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=one_pass) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a pass still runs after 120 s"
    assert errors == []
    assert sum(r.total("released") for r in reports) == 120, [r.as_dict() for r in reports]
    assert len(sent) == 120 and len({key for key, _ in sent}) == 120
    assert Transition.objects.filter(event="released").count() == 120


class TestTransitionBatch:
    """The backend step behind a batch: each move conditional, with its history row."""

    def test_matching_moves_are_made_and_a_fenced_one_is_not(self, backend):
        with freeze_time(T0):
            running = [claim(publish(n=n), task_id=f"t-{n}") for n in range(3)]
        ids = [c.job_id for c in running]
        moves = [
            Change(ids[0], "released", State.RUNNING, 1,
                      values={"lease_expires_at": None, "worker": "", "task_id": "new-0",
                       "dispatch_count": 1}, worker="host/1", task_id="t-0", reason="lost 0"),
            # attempt 7 no longer holds the claim: this one must not move
            Change(ids[1], "released", State.RUNNING, 7,
                      values={"lease_expires_at": None, "worker": "", "task_id": "new-1",
                       "dispatch_count": 1}, reason="lost 1"),
            Change(ids[2], "dead_lettered", State.RUNNING, 1,
                      values={"lease_expires_at": None, "finished_at": timezone.now(),
                       "error": {"type": "DeadLettered", "message": "é"}}, reason="dead"),
        ]
        assert backend.apply_batch(moves, timezone.now()) == {ids[0], ids[2]}
        jobs = {j.id: j for j in Job.objects.all()}
        assert (jobs[ids[0]].state, jobs[ids[0]].task_id, jobs[ids[0]].dispatch_count,
                jobs[ids[0]].worker) == (State.PENDING, "new-0", 1, "")
        assert jobs[ids[1]].state == State.RUNNING and jobs[ids[1]].task_id == "t-1"
        assert jobs[ids[2]].state == State.FAILED
        assert jobs[ids[2]].error == {"type": "DeadLettered", "message": "é"}
        released = Transition.objects.get(job_id=ids[0], event="released")
        assert (released.from_state, released.to_state, released.attempt, released.worker,
                released.task_id, released.reason) == \
            ("RUNNING", "PENDING", 1, "host/1", "t-0", "lost 0")
        assert not Transition.objects.filter(job_id=ids[1], event="released").exists()
        assert Transition.objects.get(job_id=ids[2], event="dead_lettered").reason == "dead"

    def test_a_move_the_table_forbids_is_refused(self, backend):
        with freeze_time(T0):
            job_id = claim(publish()).job_id
        with pytest.raises(InvalidTransition):
            backend.apply_batch(
                [Change(job_id, "reset", State.RUNNING, 1)], timezone.now())


def test_a_pass_over_many_jobs_of_unknown_tasks_imports_the_task_modules_once(
        monkeypatch, sent):
    """A renamed or deleted task's jobs cost a pass no more than known ones: the task
    modules are imported once per process (issue 20: once per job took ~15 ms each)."""
    from celery import current_app

    from celery_idem.recovery import handback

    imports: list[None] = []  # the outermost calls (Celery's Django fixup nests one)
    depth = [0]
    real = current_app.loader.import_default_modules

    def counted():
        imports.extend([None] if depth[0] == 0 else [])
        depth[0] += 1
        try:
            return real()
        finally:
            depth[0] -= 1

    monkeypatch.setattr(current_app.loader, "import_default_modules", counted)
    monkeypatch.setattr(handback, "_imported_modules", type(handback._imported_modules)())
    with freeze_time(T0):
        for n in range(5):
            claim(publish(n=n), task_id=f"t-{n}")
    Job.objects.update(task_name="gone.task")
    assert reap_at("2030-01-01 13:00:00").as_dict() == {"skipped": {"gone.task": 5}}
    assert reap_at("2030-01-01 14:00:00").as_dict() == {"skipped": {"gone.task": 5}}
    assert len(imports) == 1


def test_a_pass_resolves_each_task_name_once_and_unknown_tasks_add_no_queries(
        monkeypatch, sent):
    """Task names are resolved once per pass, not per job (two names, eight stale jobs
    in three batches: two look-ups), and a stale claim of a task no process knows costs
    the pass no query of its own: the same queries for two such jobs as for six."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    looked_up: list[str] = []
    real = reaper.registered_task
    monkeypatch.setattr(reaper, "registered_task",
                        lambda name: looked_up.append(name) or real(name))
    with freeze_time(T0):
        for n in range(8):
            claim(publish(n=n), task_id=f"t-{n}")
    Job.objects.filter(key__in=[f"ship/{n}" for n in range(4)]).update(task_name="gone.task")
    report = reap_at("2030-01-01 13:00:00", batch_size=3)
    assert report.as_dict() == {"released": {ship_order.name: 4}, "skipped": {"gone.task": 4}}
    assert sorted(looked_up) == sorted(["gone.task", ship_order.name])

    def queries_of_a_pass_over(unknown: int) -> int:
        Job.objects.all().delete()
        with freeze_time(T0):
            for n in range(unknown):
                claim(publish(n=n), task_id=f"t-{n}")
        Job.objects.update(task_name="gone.task")
        with CaptureQueriesContext(connection) as queries:
            assert reap_at("2030-01-01 13:00:00").as_dict() == {"skipped": {"gone.task": unknown}}
        return len(queries)

    assert queries_of_a_pass_over(2) == queries_of_a_pass_over(6)
