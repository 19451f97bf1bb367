"""Django's own Tasks framework (``django.tasks``) on real Celery workers through
``celery_idem.tasks_backend.CeleryIdemBackend`` (the tasks: django_app/effects/django_tasks.py):
one run per key, results read from the job, the outbox, failures, and crashes recovered as
for any other task. Django 6.0+ only: the newest tier runs them on Django 6.1 (and
``--full``'s django60 tier on Django 6.0)."""

from __future__ import annotations

import asyncio
import os
import signal
from datetime import timedelta

import django
import pytest

if django.VERSION < (6, 0):
    pytest.skip("Django's Tasks framework (django.tasks) is Django 6.0+: the newest and "
                "django60 tiers run these", allow_module_level=True)

from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connections, transaction
from django.tasks import TaskResultStatus, default_task_backend
from django.tasks.exceptions import TaskResultDoesNotExist
from django.utils import timezone

from celery_idem.conf import settings as idem_settings
from celery_idem.djangotasks import results
from celery_idem.errors import MissingKey
from celery_idem.metrics import gauges
from celery_idem.models import Job
from celery_idem.recovery import sweep as reaper
from django_app.effects import django_tasks
from django_app.effects.models import Effect
from django_app.effects.tasks import ship_order
from tests.db.racing import race

from .django_task_contender import enqueue as enqueue_in_a_process
from .jobs import TIMEOUT, later
from .workers import Worker, purge_queue, wait_until

pytestmark = pytest.mark.django_tasks


class Rollback(Exception):
    pass


def finished(result):
    """Wait until ``result`` (refreshed from the job) is finished; return it."""
    def done():
        result.refresh()
        return result.is_finished
    wait_until(done, TIMEOUT, what=f"result {result.id} to finish")
    return result


def signals(result_id: str) -> list[tuple[str, str, int]]:
    """Django's task signals sent for ``result_id`` (any process), in order: (signal,
    status the result said, the process that sent it)."""
    return [(e.key.split("/")[1], e.value["status"], e.pid)
            for e in Effect.objects.filter(key__endswith=f"/{result_id}",
                                           key__startswith="signal/").order_by("id")]


def signalled(result_id: str, name: str) -> None:
    """Wait until the worker has sent signal ``name`` for ``result_id`` (task_finished
    follows the commit that finished the job)."""
    wait_until(lambda: name in [n for n, *_ in signals(result_id)], TIMEOUT,
               what=f"{name} for result {result_id}")


def run_async(awaitable):
    """Run ``awaitable`` (an aenqueue, an aget_result); then close the connection that
    Django's sync_to_async thread opened for it (the test database is dropped at the end)."""
    async def run():
        try:
            return await awaitable
        finally:
            await sync_to_async(connections.close_all, thread_sensitive=True)()
    return asyncio.run(run())


def job_of(result) -> Job:
    """The job a result id names (its first part is the job's id)."""
    return Job.objects.get(id=result.id.split("-")[0])


def effects(key: str) -> int:
    return Effect.objects.filter(key=key).count()


def test_same_key_enqueued_twice_runs_once_and_a_later_enqueue_replays(worker):
    """enqueue() and aenqueue() of one key: one job (one result id), one run, both results
    SUCCESSFUL with the one return value; get_result reads it; an enqueue after the finish
    is answered SUCCESSFUL at once. Django's signals: enqueued per enqueue here, started
    and finished once on the worker."""
    first = django_tasks.ship.enqueue(1, hold=0.5)
    second = run_async(django_tasks.ship.aenqueue(1, hold=0.5))

    assert first.id == second.id and first.status == TaskResultStatus.READY
    for result in (finished(first), finished(second)):
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == {"shipped": 1, "attempt": 1, "result_id": first.id}
    assert effects("dt-ship/1") == 1
    signalled(first.id, "finished")
    read = default_task_backend.get_result(first.id)
    assert read.return_value == first.return_value and read.task is django_tasks.ship
    assert run_async(django_tasks.ship.aget_result(first.id)).status == "SUCCESSFUL"
    assert read.args == [1] and read.kwargs == {"hold": 0.5} and read.errors == []
    assert read.attempts == 1 and read.worker_ids == [job_of(read).worker]
    assert read.enqueued_at <= read.started_at == read.last_attempted_at <= read.finished_at

    again = django_tasks.ship.enqueue(1, hold=0.5)
    assert (again.id, again.status, again.return_value) == (
        first.id, TaskResultStatus.SUCCESSFUL, first.return_value)
    assert effects("dt-ship/1") == 1
    worker_pid = Effect.objects.get(key="dt-ship/1").pid
    sent = signals(first.id)
    # Each enqueued signal carries the job as that enqueue read it: the second may come
    # after the worker started it.
    assert sent[0] == ("enqueued", "READY", os.getpid())
    assert sent[-1] == ("enqueued", "SUCCESSFUL", os.getpid())
    assert [s for s in sent if s[0] != "enqueued"] == [
        ("started", "RUNNING", worker_pid), ("finished", "SUCCESSFUL", worker_pid)]
    assert [s[2] for s in sent if s[0] == "enqueued"] == [os.getpid()] * 3


def test_same_key_enqueued_from_two_processes_at_once_runs_once(worker):
    """Two producer processes enqueue one key at the same moment: both get the one result
    id, the task runs once, and its result reads SUCCESSFUL."""
    outcomes = race(enqueue_in_a_process, 2, 1, 7)

    assert len({pid for pid, _ in outcomes}) == 2
    assert len({result_id for _, result_id in outcomes}) == 1
    result = finished(default_task_backend.get_result(outcomes[0][1]))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value["shipped"] == 7 and effects("dt-ship/7") == 1
    assert Job.objects.filter(task_name=django_tasks.ship.module_path).count() == 1


def test_enqueue_in_a_rolled_back_transaction_leaves_no_job_and_no_effect(worker):
    """Inside transaction.atomic(): rolled back, no job, no message, no effect, no
    task_enqueued; committed, task_enqueued is sent on the commit and the task runs once."""
    with pytest.raises(Rollback), transaction.atomic():
        rolled_back = django_tasks.ship.enqueue(11)
        assert Job.objects.filter(key="dt-ship/11").exists()
        raise Rollback
    with transaction.atomic():
        committed = django_tasks.ship.enqueue(12)
        assert signals(committed.id) == []  # nothing has left yet
    assert [name for name, *_ in signals(committed.id)] == ["enqueued"]
    assert finished(committed).status == TaskResultStatus.SUCCESSFUL

    assert not Job.objects.filter(key="dt-ship/11").exists()
    assert effects("dt-ship/11") == 0 and signals(rolled_back.id) == []
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(rolled_back.id)
    assert effects("dt-ship/12") == 1


def test_a_failing_task_reads_failed_with_its_error(worker):
    """The body raises: FAILED, its error's class and traceback, no return value,
    task_finished says FAILED; enqueued again, the same failed job, no second run."""
    result = finished(django_tasks.fails.enqueue(3))

    assert result.status == TaskResultStatus.FAILED
    (error,) = result.errors
    assert error.exception_class is ValueError
    assert "raise ValueError" in error.traceback and "ValueError: boom 3" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    signalled(result.id, "finished")
    assert [(n, s) for n, s, _ in signals(result.id)] == [
        ("enqueued", "READY"), ("started", "RUNNING"), ("finished", "FAILED")]
    again = django_tasks.fails.enqueue(3)
    assert (again.id, again.status) == (result.id, TaskResultStatus.FAILED)
    assert effects("dt-fail/3") == 1


def test_an_async_task_and_a_deferred_one_run_on_the_worker(worker):
    """An ``async def`` task runs; one enqueued with run_after runs after it."""
    run_after = timezone.now() + timedelta(seconds=2)
    deferred = django_tasks.ship.using(run_after=run_after).enqueue(31)
    ran = finished(django_tasks.ship_async.enqueue(5))

    assert ran.status == TaskResultStatus.SUCCESSFUL and ran.return_value == {"async": 5}
    assert job_of(deferred).not_before == run_after
    assert finished(deferred).status == TaskResultStatus.SUCCESSFUL
    assert deferred.started_at >= run_after


@pytest.fixture
def flags(tmp_path, broker_service, transactional_db):
    purge_queue()
    return tmp_path


def test_a_killed_workers_job_is_recovered_as_any_other(flags):
    """The whole worker SIGKILLed mid-body: the recovery pass hands its claim back and a
    new worker runs attempt 2; the result has both attempts' workers (the effect, neither
    atomic nor keyed, happened in both, as the guarantee table says)."""
    first = Worker().start()
    try:
        result = django_tasks.wait_for_file.enqueue("whole", str(flags))
        wait_until(lambda: effects("dt-wait/whole"), TIMEOUT, what="the body to start")
    finally:
        first.kill()
    (flags / "whole").touch()
    assert default_task_backend.get_result(result.id).status == TaskResultStatus.RUNNING
    assert reaper.reap(now=later()).as_dict() == {
        "released": {django_tasks.wait_for_file.module_path: 1}}
    with Worker():
        finished(result)

    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"name": "whole", "attempt": 2}
    assert result.attempts == 2 and len(set(result.worker_ids)) == 2 and all(result.worker_ids)
    assert result.started_at < result.last_attempted_at
    assert effects("dt-wait/whole") == 2


def test_an_atomic_tasks_effect_happens_once_under_kills(flags):
    """atomic=True: its pool child SIGKILLed mid-body (the message comes back and runs
    again), then for another key the whole worker (the recovery pass re-sends it): each
    effect exists once, and each result reads SUCCESSFUL."""
    task = django_tasks.wait_for_file_atomic
    first = Worker().start()
    try:
        child = task.enqueue("child", str(flags))
        pid = int(wait_until(lambda: _started(flags, "child"), TIMEOUT, what="body start"))
        assert pid in first.children()
        os.kill(pid, signal.SIGKILL)
        (flags / "child").touch()
        assert finished(child).status == TaskResultStatus.SUCCESSFUL

        whole = task.enqueue("whole", str(flags))
        wait_until(lambda: _started(flags, "whole"), TIMEOUT, what="body start")
    finally:
        first.kill()
    (flags / "whole").touch()
    # Its claim rolled back with its body: the job reads READY, and the pass re-sends it
    # once the dead worker's transaction is gone.
    assert default_task_backend.get_result(whole.id).status == TaskResultStatus.READY
    wait_until(lambda: reaper.reap(now=later()).total("redispatched") == 1, TIMEOUT,
               interval=0.5, what="the re-dispatch of the dead worker's job")
    with Worker():
        assert finished(whole).status == TaskResultStatus.SUCCESSFUL
    assert effects("dt-atomic/child") == 1 and effects("dt-atomic/whole") == 1


def _started(folder, name: str) -> str | None:
    path = folder / f"{name}.started"
    return path.read_text() if path.exists() else None


# -- without a worker: the publish and the reads ---------------------------------------


def test_a_per_call_key_from_using_meets_the_same_job(broker_service, transactional_db):
    """``.using(idempotency_key=...)``: two enqueues, one job with that key; a PER_CALL
    task enqueued without one raises MissingKey and writes nothing."""
    keyed = django_tasks.notify.using(idempotency_key="greeting/1")
    first, second = keyed.enqueue("hi"), keyed.enqueue("hi")

    assert first.id == second.id and first.status == TaskResultStatus.READY
    assert job_of(first).key == "greeting/1"
    with pytest.raises(MissingKey):
        django_tasks.notify.enqueue("hi")
    assert Job.objects.count() == 1


def test_get_result_of_an_unknown_id_raises(broker_service, transactional_db):
    """A result id is the job's id and its key's digest, under 64 characters. No job, not
    an id, another key's digest, or the job of a plain Celery task:
    TaskResultDoesNotExist."""
    ship_order.delay(5)  # a plain IdempotentTask's job
    plain = Job.objects.get(key="ship/5")
    ours = django_tasks.ship.enqueue(6).id
    job_id, digest = ours.split("-")
    assert len(ours) < 64 and job_id == str(Job.objects.get(key="dt-ship/6").id)
    other_digest = digest[:-1] + ("1" if digest[-1] != "1" else "2")
    plain_id = results.result_id({"id": plain.id, "namespace": plain.namespace,
                                  "key": plain.key})
    for unknown in ("999999", "abc", "", f"{job_id}-{other_digest}", job_id, plain_id):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(unknown)


def test_the_admin_idem_status_and_metrics_see_a_django_tasks_job(broker_service,
                                                                  transactional_db,
                                                                  client, capsys):
    """A Django task's job is a job like any other, under its module path."""
    result = django_tasks.ship.enqueue(21)
    name = django_tasks.ship.module_path
    assert job_of(result).task_name == name

    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
    page = client.get("/admin/celery_idem/job/", {"task_name": name})
    assert page.status_code == 200 and "dt-ship/21" in page.content.decode()
    call_command("idem_status", "--json", "--exact", "--task", name)
    assert '"PENDING": 1' in capsys.readouterr().out
    reading = gauges.read(idem_settings.DATABASE, timezone.now(), 10)
    assert reading.jobs[(name, "PENDING")] == 1
