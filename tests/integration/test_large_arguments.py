"""A 1 MB argument and a 1 MB result end to end with a real worker (docs/explanation/reliability.md,
"Bad inputs"): celery-idem sets no size limit of its own; the broker's limit applies, and
a message over it ends undeliverable, never run and never lost silently."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis
from celery import current_app

from celery_idem import lean_envelope
from celery_idem.models import Job
from django_app.effects.models import Effect
from django_app.effects.tasks import add
from tests.conftest import IN_CI

from .workers import ROOT, wait_until, worker_env

TIMEOUT = 120
#: 1 MiB of text, not all ASCII (a JSON round trip that escaped it would change its size).
MEGABYTE = ("idempotent é " * 80_660)[:1_048_576]


def test_a_one_megabyte_argument_and_result_run_once_and_replay(worker):
    """Three messages of one 1 MiB call: the body runs once, every caller gets the 1 MiB
    result, and the job row keeps the arguments (once: the stored message re-sends them
    from the row) and the result whole."""
    results = [add.delay(MEGABYTE, "!") for _ in range(3)]
    assert all(r.get(timeout=TIMEOUT) == MEGABYTE + "!" for r in results)
    (effect,) = Effect.objects.all()
    assert effect.value["x"] == MEGABYTE
    job = Job.objects.get()
    assert (job.state, job.attempt, job.result) == ("SUCCEEDED", 1, MEGABYTE + "!")
    assert job.args == [MEGABYTE, "!"]
    # The stored message holds no second copy: a re-send rebuilds the body from the row.
    assert "args" not in job.message
    resent = lean_envelope.expand(current_app, job.message, job, job.task_id)
    assert resent["body"][0] == [MEGABYTE, "!"]


@pytest.fixture
def small_redis(tmp_path) -> Iterator[str]:
    """A Redis server of this test's own that refuses any value over 1 MiB (the smallest
    proto-max-bulk-len it allows), on a free port; stopped after."""
    if shutil.which("redis-server") is None:
        message = "redis-server is not installed: the test starts a Redis of its own"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--proto-max-bulk-len", "1mb", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        client = redis.Redis(port=port)
        wait_until(lambda: _pings(client), 30, what="the test's own Redis")
        yield f"redis://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def test_a_message_over_the_brokers_limit_ends_undeliverable(small_redis, transactional_db):
    """2 MB of arguments to a broker that takes 1 MiB (it answers, so the broker is not
    down: it refused the message): apply_async raises the broker's error, and the intent
    written before the publish ends FAILED as Undeliverable at once, so the call that
    raised never runs: recovery has nothing to send."""
    env = worker_env(IDEM_BROKER=f"{small_redis}/0", IDEM_RESULTS=f"{small_redis}/1")
    done = subprocess.run([sys.executable, "-m", "tests.integration.oversized_publish",
                           str(2_000_000)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=True)
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["raised"], "the oversized publish did not fail"
    assert outcome["reports"] == [{}] * 4
    job = Job.objects.get()
    assert (job.state, job.error["type"], job.dispatch_count) == ("FAILED", "Undeliverable", 0)
    assert "refused its message" in job.error["message"]
    assert not Effect.objects.exists()
