"""LeaderTask declarations: the shard template and the lease are checked when the task
class is created, and a bad one refuses that task alone, by name; the holder names the
process (and the thread off the main one)."""

from __future__ import annotations

import os
import threading

import pytest
from celery import Celery

from celery_idem import ConfigurationError, LeaderTask
from celery_idem.errors import InvalidLease
from celery_idem.leader import holder_id

app = Celery("leader-tests", set_as_current=False)


def make_task(fun, **options):
    """Create and register a task class right away, as a project's import would."""
    return app.task(base=LeaderTask, bind=True, lazy=False, shared=False, **options)(fun)


def tick(self, tenant_id, region="eu"):
    return self.fencing_token


def test_shard_template_formats_bound_arguments_with_defaults():
    task = make_task(tick, name="l.ok", shard="tenant/{tenant_id}/{region}", lease=5)
    assert task.shard_name((42,), {}) == "tenant/42/eu"
    assert task.shard_name((), {"tenant_id": 7, "region": "us"}) == "tenant/7/us"


def test_a_fixed_shard_gives_one_lease_for_every_tick():
    assert make_task(tick, name="l.fixed", shard="rebalancer", lease=5) \
        .shard_name((1,), {}) == "rebalancer"


@pytest.mark.parametrize(("options", "message"), [
    ({"lease": 5}, "needs shard="),
    ({"shard": "", "lease": 5}, "needs shard="),
    ({"shard": "tenant/{tenant}", "lease": 5}, "names 'tenant', which is not a parameter"),
    ({"shard": "tenant/{0}", "lease": 5}, "must name parameters"),
    ({"shard": "tenant/{tenant_id", "lease": 5}, "bad shard template"),
    ({"shard": "tenant/{tenant_id}"}, "needs lease="),
    ({"shard": "tenant/{tenant_id}", "lease": 0}, "needs lease="),
    ({"shard": "tenant/{tenant_id}", "lease": -3}, "needs lease="),
    ({"shard": "tenant/{tenant_id}", "lease": "60"}, "needs lease="),
])
def test_a_bad_declaration_refuses_that_task_alone_by_name(options, message):
    """Created, not raised (the app still finalizes, its other tasks work): its publishes
    and its runs raise the declaration's error, naming the task and check E001."""
    name = f"l.bad.{id(options)}"
    task = make_task(tick, name=name, **options)
    for refused in (lambda: task.apply_async((1,)), lambda: task(1)):
        with pytest.raises(ConfigurationError, match=message) as raised:
            refused()
        assert name in str(raised.value) and "celery_idem.E001" in str(raised.value)
    fine = make_task(tick, name=f"{name}.beside", shard="tenant/{tenant_id}", lease=5)
    assert fine.shard_name((1,), {}) == "tenant/1"


def test_a_template_that_fails_on_the_arguments_is_invalid_lease():
    task = make_task(tick, name="l.attr", shard="tenant/{tenant_id.pk}", lease=5)
    with pytest.raises(InvalidLease, match="failed on these arguments"):
        task.shard_name((1,), {})


def test_called_directly_the_body_runs_without_a_lease():
    task = make_task(tick, name="l.direct", shard="tenant/{tenant_id}", lease=5)
    assert task(1) is None  # no fencing token outside a worker
    with pytest.raises(ConfigurationError, match="only held inside"):
        task.check_lease()


def test_holder_names_the_process_and_the_thread_off_the_main_one():
    assert holder_id("w1@host") == f"w1@host/{os.getpid()}"
    assert holder_id(None) == f"local/{os.getpid()}"
    seen = []
    thread = threading.Thread(target=lambda: seen.append(holder_id("w1@host")))
    thread.start()
    thread.join()
    assert seen == [f"w1@host/{os.getpid()}/{thread.ident}"]
