"""Worker liveness against the database: a worker's heartbeat row, and the recovery pass
that hands back the claims of a worker silent for CELERY_IDEM_WORKER_TIMEOUT, while it
has watched, whatever their lease (the clock moved by freezegun)."""

from __future__ import annotations

import pytest
from django.test import override_settings
from freezegun import freeze_time

from celery_idem import claims, liveness
from celery_idem.models import Job, WorkerHeartbeat
from celery_idem.recovery.liveness import OBSERVER
from celery_idem.states import State
from tests.db.reaping import T0, claim, last, publish, reap_at
from tests.db.reaping import sent as sent
from tests.db.reaping import timeouts as timeouts
from tests.db.test_reaper_stale_claims import send_mail

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 3600  # the default lease: a task without a time limit
DEAD = "celery@gone#0123456789ab"


@pytest.fixture(autouse=True)
def liveness_settings():
    with override_settings(CELERY_IDEM_WORKER_HEARTBEAT=5, CELERY_IDEM_WORKER_TIMEOUT=30):
        yield


def beat(worker: str, at: str) -> None:
    """``worker`` proves it is alive at ``at`` (its heartbeat thread's write)."""
    with freeze_time(at):
        liveness.Heartbeat(worker, "celery@gone", "default", 5).beat()


def held_by(worker: str, task=None, n: int = 1):
    """A claim of ``worker``'s pool process 1 at T0, under the default lease."""
    with freeze_time(T0):
        intent = publish(task, n) if task else publish(n=n)
        claim(intent, worker=f"{worker}/1", lease=LEASE)
    return intent


def watch(*times: str):
    """Recovery passes at ``times``; the report of the last."""
    reports = [reap_at(at) for at in times]
    return reports[-1]


def test_a_silent_worker_s_claims_come_back_long_before_their_lease(backend, sent):
    """Beat at T0, then silence: the pass 40 s later (recovery watching since T0 + 5 s)
    releases the claim and sends it again; the reason names the worker and the timeout;
    the dead worker's row is forgotten."""
    beat(DEAD, T0)
    held_by(DEAD)
    report = watch("2030-01-01 12:00:05", "2030-01-01 12:00:25", "2030-01-01 12:00:40")
    assert report.as_dict() == {"released": {"django_app.effects.tasks.ship_order": 1}}
    assert [key for key, _ in sent] == ["ship/1"]
    released = last("ship/1", "released")
    assert released.reason.startswith(f"worker stopped beating: {DEAD} last proved alive")
    assert "30s" in released.reason and released.attempt == 1
    assert Job.objects.get(key="ship/1").state == State.PENDING
    assert not WorkerHeartbeat.objects.filter(worker=DEAD).exists()


def test_a_worker_that_beats_keeps_its_claims(backend, sent):
    """A long body under a live worker: its beats keep the claim however long it runs."""
    held_by(DEAD)
    for second in range(0, 120, 5):
        at = f"2030-01-01 12:{second // 60:02d}:{second % 60:02d}"
        beat(DEAD, at)
        assert reap_at(at).as_dict() == {}
    assert Job.objects.get(key="ship/1").state == State.RUNNING and sent == []


def test_after_an_outage_recovery_waits_a_whole_timeout_before_presuming_death(backend, sent):
    """The last pass and the last beats were before a 10-minute outage: the first passes
    after it take nothing (the workers had no chance to beat); the worker that beats
    again keeps its claim, the one that stays silent loses it one timeout later."""
    alive = "celery@alive#ba9876543210"
    beat(DEAD, T0)
    beat(alive, T0)
    held_by(DEAD, n=1)
    held_by(alive, n=2)
    watch("2030-01-01 12:00:01")
    assert watch("2030-01-01 12:10:01", "2030-01-01 12:10:21").as_dict() == {}
    beat(alive, "2030-01-01 12:10:22")
    report = watch("2030-01-01 12:10:35")
    assert report.as_dict() == {"released": {"django_app.effects.tasks.ship_order": 1}}
    assert Job.objects.get(key="ship/1").state == State.PENDING
    assert Job.objects.get(key="ship/2").state == State.RUNNING


def test_a_pass_with_a_moved_clock_takes_no_live_worker_s_claims(backend, sent):
    """A pass an hour ahead (an operator looking ahead, a test) starts the watch over;
    the next real pass does not presume the beating worker dead."""
    beat(DEAD, T0)
    held_by(DEAD)
    assert watch("2030-01-01 12:00:01", "2030-01-01 12:59:00").as_dict() == {}
    beat(DEAD, "2030-01-01 12:00:20")
    assert watch("2030-01-01 12:00:21", "2030-01-01 12:00:41").as_dict() == {}
    assert Job.objects.get(key="ship/1").state == State.RUNNING


def test_a_claim_without_a_heartbeat_waits_for_its_lease(backend, sent):
    """A worker that never beat (an older version, the heartbeat off): the lease decides."""
    held_by("celery@old")
    assert watch("2030-01-01 12:00:01", "2030-01-01 12:00:21",
                 "2030-01-01 12:00:41").as_dict() == {}
    report = reap_at("2030-01-01 13:00:01")
    assert report.as_dict() == {"released": {"django_app.effects.tasks.ship_order": 1}}
    assert last("ship/1", "released").reason.startswith("stale claim")


def test_a_task_that_must_not_re_run_blindly_ends_uncertain(backend, sent):
    """The same hand-back rule as every lost worker: UNCERTAIN, never sent again."""
    beat(DEAD, T0)
    held_by(DEAD, send_mail)
    report = watch("2030-01-01 12:00:05", "2030-01-01 12:00:25", "2030-01-01 12:00:40")
    assert report.as_dict() == {"uncertain": {"tests.reaper.send_mail": 1}}
    assert Job.objects.get(key="mail/1").state == State.UNCERTAIN and sent == []


def test_the_heartbeat_writes_one_row_per_worker_and_comes_back_after_a_delete():
    """Each beat moves the row's beat_at; a row deleted meanwhile (recovery forgot a
    frozen worker) is written again by its next beat."""
    beat(DEAD, T0)
    beat(DEAD, "2030-01-01 12:00:05")
    row = WorkerHeartbeat.objects.get(worker=DEAD)
    assert (row.started_at.second, row.beat_at.second) == (0, 5)
    WorkerHeartbeat.objects.filter(worker=DEAD).delete()
    beat(DEAD, "2030-01-01 12:00:10")
    assert WorkerHeartbeat.objects.get(worker=DEAD).beat_at.second == 10
    assert not WorkerHeartbeat.objects.filter(worker=OBSERVER).exists()


def test_a_claim_names_the_run_of_its_worker(monkeypatch):
    """In a worker that beats, a claim's worker is ``<host>#<run>/<pid>``: a restarted
    worker with the same host name and pids is another worker."""
    monkeypatch.setattr(liveness, "_run", None)  # not a worker
    assert claims.worker_id("celery@h", 7) == "celery@h/7"
    monkeypatch.setattr(liveness, "_run", "0123456789ab")
    assert claims.worker_id("celery@h", 7) == "celery@h#0123456789ab/7"


def test_a_failed_beat_is_logged_once_and_the_next_one_writes(monkeypatch, caplog):
    """The database down: each beat fails, one warning for the outage; back up, the next
    beat writes the row and says so."""
    from django.db import OperationalError
    from django.db.models import QuerySet

    heartbeat = liveness.Heartbeat(DEAD, "celery@gone", "default", 5)
    real_update = QuerySet.update

    def down(self, **values):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(QuerySet, "update", down)
    with caplog.at_level("WARNING", logger="celery_idem.liveness"):
        assert not heartbeat.beat() and not heartbeat.beat()
        monkeypatch.setattr(QuerySet, "update", real_update)
        assert heartbeat.beat()
    assert [r.action for r in caplog.records] == ["heartbeat_failed", "heartbeat_resumed"]
    assert WorkerHeartbeat.objects.filter(worker=DEAD).exists()
