"""A 1 MB argument and a 1 MB result end to end with a real worker (docs/reliability.md,
"Bad inputs"): celery-idem sets no size limit of its own; the broker's limit applies."""

from __future__ import annotations

from celery_idem.models import Job
from django_app.effects.models import Effect
from django_app.effects.tasks import add

TIMEOUT = 120
#: 1 MiB of text, not all ASCII (a JSON round trip that escaped it would change its size).
MEGABYTE = ("idempotent é " * 80_660)[:1_048_576]


def test_a_one_megabyte_argument_and_result_run_once_and_replay(worker):
    """Three messages of one 1 MiB call: the body runs once, every caller gets the 1 MiB
    result, and the job row keeps the arguments, the message and the result whole."""
    results = [add.delay(MEGABYTE, "!") for _ in range(3)]
    assert all(r.get(timeout=TIMEOUT) == MEGABYTE + "!" for r in results)
    (effect,) = Effect.objects.all()
    assert effect.value["x"] == MEGABYTE
    job = Job.objects.get()
    assert (job.state, job.attempt, job.result) == ("SUCCEEDED", 1, MEGABYTE + "!")
    assert job.args == [MEGABYTE, "!"]
    assert job.message["body"][0] == [MEGABYTE, "!"]
