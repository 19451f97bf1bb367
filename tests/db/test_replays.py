"""A publish that finds its key SUCCEEDED sends no message when nobody would see the
replay (celery_idem.replays): its result ignored, no canvas, no group. Every other
duplicate's message still leaves. On every database the tier has, both backends."""

from __future__ import annotations

import json

import pytest
from celery import chain, group, shared_task
from django.db import transaction

from celery_idem import IdempotentTask, batch
from celery_idem.keys import KEY_HEADER
from celery_idem.models import Job
from celery_idem.replays import ANSWERED_REASON
from celery_idem.signals import transition
from tests.db.test_round_trips import count, echo

pytestmark = pytest.mark.django_db(transaction=True)


@shared_task(base=IdempotentTask, bind=True, idempotency_key="quiet/{n}", name="tests.quiet",
             ignore_result=True)
def quiet(self, n):
    return n


def finish(task, n: int) -> Job:
    """Run ``task(n)`` here to SUCCEEDED, as a first delivery would."""
    key = task.intent((n,)).key
    task.apply(args=(n,), headers={KEY_HEADER: key}).get()
    job = Job.objects.get(key=key)
    assert job.state == "SUCCEEDED"
    return job


@pytest.fixture
def announced():
    """The transitions announced while the test runs."""
    seen: list[dict] = []

    def receiver(sender, **fields):
        seen.append(fields)

    transition.connect(receiver)
    yield seen
    transition.disconnect(receiver)


def test_a_finished_key_whose_result_is_ignored_sends_nothing(backend, sent, announced):
    """The intent's try finds the key SUCCEEDED (the statements of any duplicate publish);
    no message leaves, the row is as it was, and the publish is announced as a duplicate,
    as the worker's replay is."""
    quiet.apply_async(args=(10,))
    duplicate = count(lambda: quiet.apply_async(args=(10,)))  # of a PENDING key: sent
    job = finish(quiet, 1)
    sent.clear()
    announced.clear()
    assert count(lambda: quiet.apply_async(args=(1,))) == duplicate
    assert sent == []
    again = Job.objects.get(pk=job.pk)
    assert (again.state, again.attempt, again.updated_at) == ("SUCCEEDED", 1, job.updated_at)
    (line,) = announced
    assert (line["event"], line["job_id"], line["reason"]) == (
        "duplicate", job.pk, ANSWERED_REASON)


@pytest.mark.parametrize(("publish", "keys"), [
    pytest.param(lambda: echo.apply_async(args=(2,)), ["echo/2"], id="result stored"),
    pytest.param(lambda: quiet.apply_async(args=(2,), ignore_result=False), ["quiet/2"],
                 id="the call stores the result"),
    pytest.param(lambda: quiet.apply_async(args=(2,), link=echo.si(20)), ["quiet/2"],
                 id="a callback"),
    pytest.param(lambda: chain(quiet.si(2), echo.si(21)).apply_async(), ["quiet/2"],
                 id="a chain"),
    pytest.param(lambda: group(quiet.si(2), quiet.si(9)).apply_async(), ["quiet/2", "quiet/9"],
                 id="a group"),
])
def test_a_finished_key_whose_replay_someone_sees_still_sends(backend, sent, publish, keys):
    """A stored result, a callback, the rest of a chain or a group need the replay: the
    message leaves."""
    finish(quiet, 2)
    finish(echo, 2)
    publish()
    assert sorted(h[KEY_HEADER] for h in sent) == keys


@pytest.mark.parametrize("state", ["PENDING", "RUNNING", "FAILED", "EXPIRED"])
def test_a_key_not_succeeded_still_sends(backend, sent, state):
    """Only a success is answered at publish: a failure's replay raises (Celery reports
    it), and a pending or running key's message is the one that runs or waits."""
    job = finish(quiet, 3)
    Job.objects.filter(pk=job.pk).update(state=state)
    quiet.apply_async(args=(3,))
    assert [h[KEY_HEADER] for h in sent] == ["quiet/3"]


def test_in_a_transaction_nothing_is_sent_at_the_commit(backend, sent):
    """The outbox: a finished key's publish in ``atomic()`` queues no message."""
    finish(quiet, 4)
    with transaction.atomic():
        quiet.apply_async(args=(4,))
        quiet.apply_async(args=(5,))
    assert [h[KEY_HEADER] for h in sent] == ["quiet/5"]


def test_a_batch_sends_only_the_keys_not_answered(backend, sent):
    """In a batch the finished key sends nothing; the fresh keys' messages leave."""
    finish(quiet, 6)
    with batch():
        for n in (6, 7, 8):
            quiet.apply_async(args=(n,))
    assert sorted(h[KEY_HEADER] for h in sent) == ["quiet/7", "quiet/8"]


#: Keys in an order jsonb would not keep (it sorts them shortest first, then by bytes).
ORDERED_RESULT = {"zebra": 1, "mango": {"y": [1, 2], "b": None}, "a": "first?", "ab": 2.5}


@pytest.mark.parametrize("result", [ORDERED_RESULT, "12", None, [3, {"b": 1, "a": 2}]],
                         ids=["object", "string-of-digits", "null", "list"])
def test_a_replayed_result_is_the_json_the_first_caller_got(backend, result):
    """The stored result keeps its keys' order, nested ones too, and its type (a string of
    digits stays a string) on every backend: the row read back by a duplicate's claim,
    and by the ORM (the admin)."""
    from celery_idem import claims
    from tests.db.reaping import claim, publish

    intent = publish(n=4401)
    claim(intent).succeed(result)
    outcome, won = claims.acquire(intent, worker="host/2", task_id="t-2", lease_seconds=60,
                                  using="default")
    assert won is None
    assert json.dumps(outcome.row.result) == json.dumps(result)
    stored = Job.objects.get(key=intent.key).result
    assert json.dumps(stored) == json.dumps(result)
