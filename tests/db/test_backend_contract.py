"""The backend contract: memory, portable (ORM) and the database's own backend
(PostgreSQL's, MySQL's) render the same moves.

Each test drives a backend through its public steps only and checks what it reports
and what it recorded, so the three renderings cannot drift apart.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from celery_idem.backends import Change, Claimant, Intent, get_backend
from celery_idem.backends.generic import GenericBackend
from celery_idem.errors import InvalidTransition
from celery_idem.models import Job, Transition
from celery_idem.states import State, StepWrite, stale_q
from celery_idem.testing import InMemoryBackend

pytestmark = pytest.mark.django_db(transaction=True)

#: The database's own backend (PostgreSQL's, MySQL's named queries) where it has one.
NATIVE = ["native"] if settings.DATABASE_KIND in ("postgres", "mysql") else []
KINDS = ["memory", "generic", *NATIVE]


@pytest.fixture(params=KINDS)
def store(request):
    if request.param == "memory":
        return InMemoryBackend()
    return GenericBackend("default") if request.param == "generic" else get_backend("default")


def history(store, job_id):
    """(event, from, to, attempt) of the job's history lines, in order."""
    if isinstance(store, InMemoryBackend):
        lines = [(h.event, h.from_state, h.to_state, h.attempt) for h in store.history
                 if h.job_id == job_id]
    else:
        lines = list(Transition.objects.filter(job_id=job_id).order_by("id")
                     .values_list("event", "from_state", "to_state", "attempt"))
    return [(e, f and State(f), State(t), a) for e, f, t, a in lines]


def intent(key="k", fingerprint="fp", namespace="ns"):
    return Intent(namespace, key, "tests.task", fingerprint, [1], {}, {"queue": "q"})


def claimant(task_id="t-1", lease=60, now=None):
    now = now or timezone.now()
    return Claimant("host/1", task_id, now, now + timedelta(seconds=lease))


def test_publish_inserts_once_and_reports_the_existing_row(store):
    first = store.publish(intent(), "t-0", timezone.now())
    again = store.publish(intent(fingerprint="other"), "t-9", timezone.now())
    assert first.won and first.row.state is State.PENDING and first.row.attempt == 0
    assert not again.won and again.row.id == first.row.id and again.row.fingerprint == "fp"
    assert history(store, first.row.id) == []  # the happy path records no history


def test_publish_many_inserts_each_new_key_once_in_order(store):
    """A batch: new keys won, an existing key and a key repeated in the batch not won,
    each with the row that stands (its fingerprint for the caller to check)."""
    existing = store.publish(intent("old"), "t-0", timezone.now()).row
    outcomes = store.publish_many([(intent("a"), "t-1"), (intent("old", "other"), "t-2"),
                                   (intent("b"), "t-3"), (intent("a", "fp-2"), "t-4")],
                                  timezone.now())
    a, old, b, again = outcomes
    assert a.won and b.won and not old.won and not again.won
    assert old.row.id == existing.id and old.row.fingerprint == "fp"
    assert again.row.id == a.row.id and again.row.fingerprint == "fp"
    assert (a.row.state, a.row.attempt, a.row.task_id) == (State.PENDING, 0, "t-1")
    assert a.row.id != b.row.id
    assert history(store, a.row.id) == []  # the published move records no history


def test_publish_many_tells_a_key_apart_by_its_namespace(store):
    """One key in two namespaces is two jobs; an existing key is found in its own."""
    existing = store.publish(intent("old", namespace="ns2"), "t-0", timezone.now()).row
    a1, a2, old, old1 = store.publish_many(
        [(intent("a", namespace="ns1"), "t-1"), (intent("a", namespace="ns2"), "t-2"),
         (intent("old", "other", "ns2"), "t-3"), (intent("old", namespace="ns1"), "t-4")],
        timezone.now())
    assert a1.won and a2.won and old1.won and not old.won
    assert len({a1.row.id, a2.row.id, old1.row.id, existing.id}) == 4
    assert (old.row.id, old.row.fingerprint, old.row.task_id) == (existing.id, "fp", "t-0")
    assert (a2.row.task_id, old1.row.task_id) == ("t-2", "t-4")


def row_version(store, job_id):
    """What changes whenever the job row is written: its updated_at, and on PostgreSQL
    the tuple's version (xmin, ctid) too."""
    if isinstance(store, InMemoryBackend):
        return store.jobs[job_id].updated_at
    if store.connection().vendor == "postgresql":
        with store.connection().cursor() as cursor:
            cursor.execute(f"SELECT xmin::text, ctid::text, updated_at FROM "
                           f"{Job._meta.db_table} WHERE id = %s", [job_id])
            return cursor.fetchone()
    return Job.objects.get(pk=job_id).updated_at


def test_claim_then_duplicate_replays_and_writes_nothing(store):
    job = store.publish(intent(), "t-0", timezone.now()).row
    won = store.claim("claimed", intent(), claimant())
    assert won.won and won.row.attempt == 1 and won.row.state is State.RUNNING
    assert store.apply(Change(job.id, "succeeded", State.RUNNING, attempt=1,
                              values={"result": {"ok": True}}), timezone.now())
    before = row_version(store, job.id)
    dup = store.claim("claimed", intent(), claimant("t-2"))
    assert not dup.won and not dup.recorded and dup.row.result == {"ok": True}
    other = store.claim("claimed", intent(fingerprint="x"), claimant("t-3"))
    assert not other.won and not other.recorded
    # A replay of a finished key is a read: no history line, the row not rewritten.
    assert history(store, job.id) == []
    assert row_version(store, job.id) == before
    assert store.state_of(job.id) == (State.SUCCEEDED, 1)


def test_claim_new_inserts_running_or_reports_the_row(store):
    won = store.claim_new(intent(), claimant(), "no intent was published")
    lost = store.claim_new(intent(), claimant("t-2"), "no intent was published")
    assert won.won and won.row.state is State.RUNNING and won.row.attempt == 1
    assert not lost.won and lost.row.id == won.row.id
    assert history(store, won.row.id) == []


def test_commit_new_inserts_the_finished_row_unless_the_key_exists(store):
    """An optimistic atomic body's commit: the key's row inserted SUCCEEDED at attempt 1
    with its result, no lease and no history line; a second commit of the key (or one
    meeting a published intent) inserts nothing. (Outside a transaction here: a commit
    that loses leaves its caller's to roll back, and there is none.)"""
    started = timezone.now() - timedelta(seconds=2)
    assert store.commit_new(intent(), claimant(now=started), {"b": 1, "a": 2}, timezone.now())
    store.publish(intent("pending"), "t-0", timezone.now())
    for key in ("k", "pending"):
        assert not store.commit_new(intent(key), claimant("t-2"), {"other": 1}, timezone.now())
    row = store.claim("claimed", intent(), claimant("t-3")).row  # a duplicate's replay
    assert (row.state, row.attempt, row.lease_expires_at) == (State.SUCCEEDED, 1, None)
    assert list(row.result) == ["b", "a"] and row.result == {"b": 1, "a": 2}
    assert history(store, row.id) == []
    if not isinstance(store, InMemoryBackend):
        job = Job.objects.get(pk=row.id)
        assert (job.task_id, job.worker, job.started_at) == ("t-1", "host/1", started)
        assert started < job.finished_at == job.updated_at and job.args == [1]


def test_take_over_needs_an_expired_lease(store):
    past = timezone.now() - timedelta(minutes=5)
    store.publish(intent(), "t-0", past)
    store.claim("claimed", intent(), claimant(now=past, lease=60))
    live = store.claim("taken_over", intent(), claimant("t-live", lease=600,
                                                         now=past + timedelta(seconds=30)))
    taken = store.claim("taken_over", intent(), claimant("t-2"))
    assert not live.won and taken.won and taken.row.attempt == 2


def test_fenced_moves_lose_to_a_newer_attempt(store):
    past = timezone.now() - timedelta(minutes=5)
    job = store.publish(intent(), "t-0", past).row
    store.claim("claimed", intent(), claimant(now=past, lease=60))
    store.claim("taken_over", intent(), claimant("t-2"))
    now = timezone.now()
    assert not store.apply(Change(job.id, "succeeded", State.RUNNING, attempt=1,
                                  values={"result": 1}), now)
    assert store.apply(Change(job.id, "late_finish", State.RUNNING, attempt=1), now)
    assert store.apply(Change(job.id, "heartbeat", State.RUNNING, attempt=2,
                              values={"lease_expires_at": now}), now)
    assert history(store, job.id)[-1] == ("late_finish", State.RUNNING, State.RUNNING, 1)


def test_a_late_finish_after_the_newer_attempt_succeeded_records_the_state_it_met(store):
    """Found by the chaos suite: a zombie resumed after its take-over had already
    succeeded recorded its late finish as RUNNING -> RUNNING after the job's SUCCEEDED,
    a history that is no path through the move table. The line says the job's state."""
    from celery_idem.history import path_errors

    past = timezone.now() - timedelta(minutes=5)
    job = store.publish(intent(), "t-0", past).row
    store.claim("claimed", intent(), claimant(now=past, lease=60))
    store.claim("taken_over", intent(), claimant("t-2"))
    now = timezone.now()
    assert store.apply(Change(job.id, "succeeded", State.RUNNING, attempt=2,
                              values={"result": 2}), now)
    assert not store.apply(Change(job.id, "succeeded", State.RUNNING, attempt=1,
                                  values={"result": 1}), now)
    assert store.apply(Change(job.id, "late_finish", State.RUNNING, attempt=1), now)
    lines = history(store, job.id)
    assert lines[-1] == ("late_finish", State.SUCCEEDED, State.SUCCEEDED, 1)
    assert path_errors([line[:3] for line in lines], State.SUCCEEDED) == []


def test_the_table_refuses_what_it_does_not_allow(store):
    job = store.publish(intent(), "t-0", timezone.now()).row
    now = timezone.now()
    for change in [
        Change(job.id, "succeeded", State.PENDING, attempt=0),           # wrong source
        Change(job.id, "released", State.RUNNING, values={}),            # fenced, no attempt
        Change(job.id, "reset", State.FAILED, attempt=0, values={"result": 1}),  # column
        Change(job.id, "redispatched", State.PENDING, attempt=0),        # no dispatch count
    ]:
        with pytest.raises(InvalidTransition):
            store.apply(change, now)
    with pytest.raises(InvalidTransition):
        store.claim("succeeded", intent(), claimant())
    assert history(store, job.id) == []
    assert store.state_of(job.id) == (State.PENDING, 0)


def test_redispatch_is_guarded_by_the_dispatch_count(store):
    job = store.publish(intent(), "t-0", timezone.now()).row
    change = Change(job.id, "redispatched", State.PENDING, attempt=0, dispatch_count=0,
                    values={"dispatch_count": 1, "task_id": "t-again"})
    assert store.apply(change, timezone.now())
    assert not store.apply(change, timezone.now())  # a second pass that saw count 0


def test_batches_move_the_matching_rows_and_count_resets(store):
    past = timezone.now() - timedelta(minutes=5)
    ids = []
    for n in range(3):
        ids.append(store.publish(intent(f"k{n}"), "t-0", past).row.id)
        store.claim("claimed", intent(f"k{n}"), claimant(f"t-{n}", now=past, lease=1))
    with store.locked_batch(stale_q(timezone.now()), 10, ("lease_expires_at", "id")) as jobs:
        assert [j.id for j in jobs] == ids
        moved = store.apply_batch([
            Change(ids[0], "released", State.RUNNING, 1, values={"lease_expires_at": None}),
            Change(ids[1], "released", State.RUNNING, 7, values={"lease_expires_at": None}),
            Change(ids[2], "dead_lettered", State.RUNNING, 1,
                   values={"error": {"type": "X"}}),
        ], timezone.now())
    assert moved == {ids[0], ids[2]}
    assert store.apply(Change(ids[2], "reset", State.FAILED, attempt=1), timezone.now())
    assert store.attempts_since_reset(ids[2], 3) == 2
    assert store.attempts_since_reset(ids[0], 3) == 3
    assert store.task_names(10) == ["tests.task"]


def starts(store, job_id):
    """(event, attempt, attempt_started_at) of the job's history lines, in order."""
    if isinstance(store, InMemoryBackend):
        return [(h.event, h.attempt, h.attempt_started_at) for h in store.history
                if h.job_id == job_id]
    return list(Transition.objects.filter(job_id=job_id).order_by("id")
                .values_list("event", "attempt", "attempt_started_at"))


def test_the_moves_that_end_an_attempt_keep_its_start(store):
    """Each way an attempt ends but a success keeps when it started in its history line:
    a take-over (the attempt before its own), a batch's release, a failure; a move that
    ends no attempt keeps none, and the happy path still records nothing."""
    first = timezone.now() - timedelta(minutes=5)
    second, third = first + timedelta(minutes=2), timezone.now()
    job = store.publish(intent(), "t-0", first).row
    store.claim("claimed", intent(), claimant("t-1", lease=60, now=first))
    assert store.claim("taken_over", intent(), claimant("t-2", lease=1, now=second)).won
    assert store.apply_batch([Change(job.id, "released", State.RUNNING, 2,
                                     values={"lease_expires_at": None})], timezone.now())
    assert store.claim("claimed", intent(), claimant("t-3", now=third)).won
    assert store.apply(Change(job.id, "failed", State.RUNNING, attempt=3,
                              values={"error": {"type": "X"}}), timezone.now())
    assert store.apply(Change(job.id, "reset", State.FAILED, attempt=3), timezone.now())
    assert starts(store, job.id) == [("taken_over", 2, first), ("released", 2, second),
                                     ("failed", 3, third), ("reset", 3, None)]


def step(job_id, attempt, name="ocr"):
    return Change(job_id, "step_completed", State.RUNNING, attempt=attempt,
                  reason=f"step {name!r}")


def test_steps_are_stored_once_and_fenced_by_the_attempt(store):
    """A step is stored once; a zombie attempt can neither add nor overwrite one."""
    past = timezone.now() - timedelta(minutes=5)
    job = store.publish(intent(), "t-0", past).row
    store.claim("claimed", intent(), claimant(now=past, lease=60))
    now = timezone.now()
    assert store.save_step(step(job.id, 1), "ocr", {"text": "a"}, now) is StepWrite.STORED
    assert store.save_step(step(job.id, 1), "ocr", {"text": "b"}, now) is StepWrite.EXISTS
    assert store.claim("taken_over", intent(), claimant("t-2")).won
    assert store.save_step(step(job.id, 1, "index"), "index", 1, now) is StepWrite.FENCED
    assert store.read_step(job.id, "index") == (False, None)
    assert store.save_step(step(job.id, 2, "index"), "index", None, now) is StepWrite.STORED
    assert store.read_step(job.id, "ocr") == (True, {"text": "a"})
    assert store.read_step(job.id, "index") == (True, None)
    assert store.apply(Change(job.id, "released", State.RUNNING, attempt=2,
                              values={"lease_expires_at": None}), now)
    assert store.save_step(step(job.id, 2, "x"), "x", 1, now) is StepWrite.FENCED  # PENDING
    with pytest.raises(InvalidTransition):
        store.save_step(Change(job.id, "late_finish", State.PENDING), "x", 1, now)
    steps = [(e, a) for e, f, t, a in history(store, job.id) if e == "step_completed"]
    assert steps == [("step_completed", 1), ("step_completed", 2)]
    assert store.clear_steps(job.id) == 2 and store.read_step(job.id, "ocr") == (False, None)


def test_a_child_intent_keeps_its_parent(store):
    parent = store.publish(intent("p"), "t-0", timezone.now()).row
    child = Intent("ns", "c", "tests.task", "fp", [], {}, {}, parent_id=parent.id)
    row = store.publish(child, "t-1", timezone.now()).row
    stored = (store.jobs[row.id].parent_id if isinstance(store, InMemoryBackend)
              else Job.objects.get(pk=row.id).parent_id)
    assert stored == parent.id


def test_a_claim_handed_to_its_replacement_is_never_taken_over(store):
    """``replaced``: RUNNING with no lease, fenced; even a clock past every lease finds it
    live, and the replacement's last step commits it under the same attempt."""
    store.publish(intent(), "t-1", timezone.now())
    job = store.claim("claimed", intent(), claimant()).row
    assert store.apply(Change(job.id, "replaced", State.RUNNING, attempt=1,
                              values={"lease_expires_at": None, "worker": ""}),
                       timezone.now())
    assert store.state_of(job.id) == (State.RUNNING, 1)
    later = claimant("t-2", now=timezone.now() + timedelta(days=30))
    lost = store.claim("taken_over", intent(), later)
    assert not lost.won and lost.row.lease_expires_at is None
    assert store.apply(Change(job.id, "succeeded", State.RUNNING, attempt=1,
                              values={"result": 12, "lease_expires_at": None,
                                      "finished_at": timezone.now()}), timezone.now())
    assert store.state_of(job.id) == (State.SUCCEEDED, 1)
    assert [e for e, *_ in history(store, job.id)] == ["replaced"]


def test_the_envelope_outbox_mark_and_expiry(store):
    """The intent keeps its message, ETA, expiry and sent mark; ``sent`` marks an unsent
    intent only while no claim took it; ``expired`` ends a PENDING job, and a claim then
    replays it without writing."""
    now = timezone.now()
    message = {"v": 1, "headers": {"id": "t-0"}, "body": [[1], {}, {}]}
    kept = Intent("ns", "k", "tests.task", "fp", [1], {}, {}, message=message,
                  not_before=now + timedelta(hours=1), expires_at=now + timedelta(hours=2),
                  sent=False)
    job = store.publish(kept, "t-0", now).row
    assert job.not_before == now + timedelta(hours=1)
    mark = Change(job.id, "sent", State.PENDING, attempt=0, values={"sent_at": now})
    assert store.apply(mark, now)
    assert not store.apply(Change(job.id, "sent", State.PENDING, attempt=1,
                                  values={"sent_at": now}), now)
    assert store.apply(Change(job.id, "expired", State.PENDING, attempt=0,
                              values={"error": {"type": "Expired"}, "finished_at": now}), now)
    lost = store.claim("claimed", kept, claimant(task_id="t-0", now=now))
    assert not lost.won and lost.row.state is State.EXPIRED and not lost.recorded
    assert [line[0] for line in history(store, job.id)] == ["expired"]
