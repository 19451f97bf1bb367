"""IdempotentTask's publish, in-process: the intent written before the message leaves,
the checks that refuse a publish (arguments, keys), canvas and ``send_task`` by name."""

from __future__ import annotations

import datetime

import pytest
from celery import chain, group

from celery_idem import ArgumentsNotJSON, InvalidKey, KeyMismatch, MissingKey
from celery_idem.by_name import ERROR_HEADER, on_before_task_publish, refused_error
from celery_idem.models import Job
from django_app.celery import app
from django_app.effects.models import Effect
from django_app.effects.tasks import add, notify, ship_order

pytestmark = pytest.mark.django_db(transaction=True)


class TestPublish:
    def test_delay_writes_the_intent_and_sends_the_key_header(self, backend):
        """delay(): PENDING intent under the template key, arguments stored."""
        result = ship_order.delay(77)
        job = Job.objects.get(key="ship/77")
        assert (job.state, job.args, job.task_id) == ("PENDING", [77], result.id)

    def test_per_call_key_overrides_the_template(self, backend):
        """apply_async(idempotency_key=...) wins over the declared template."""
        ship_order.apply_async(args=(42,), idempotency_key="ship/42/manual")
        assert Job.objects.filter(key="ship/42/manual").exists()
        assert not Job.objects.filter(key="ship/42").exists()

    def test_arguments_that_are_not_json_are_refused_before_sending(self, backend):
        """Nothing is written or sent for a datetime argument."""
        with pytest.raises(ArgumentsNotJSON):
            ship_order.delay(datetime.datetime(2026, 1, 1))
        assert not Job.objects.exists()

    @pytest.mark.parametrize("key", ["", "x" * 256, 5])
    def test_bad_per_call_keys_are_refused(self, backend, key):
        """Empty, too long or non-string keys raise InvalidKey at publish."""
        with pytest.raises(InvalidKey):
            notify.apply_async(args=(1, "hi"), idempotency_key=key)
        assert not Job.objects.exists()

    def test_missing_per_call_key_is_refused(self, backend):
        """A PER_CALL task needs its key on every call."""
        assert notify._get_current_object()._key_spec.per_call
        with pytest.raises(MissingKey):
            notify.delay(1, "hi")

    def test_same_key_other_arguments_is_a_key_mismatch_at_publish(self, backend):
        """The second publish raises before sending; the stored intent is unchanged."""
        notify.apply_async(args=(1, "hi"), idempotency_key="n-1")
        with pytest.raises(KeyMismatch):
            notify.apply_async(args=(1, "bye"), idempotency_key="n-1")
        assert Job.objects.get(key="n-1").args == [1, "hi"]

    def test_signatures_chains_and_groups_write_intents(self, backend):
        """Canvas goes through apply_async: every task that can be keyed is."""
        add.s(1, 2).delay()
        group(add.s(i, 100) for i in range(3)).apply_async()
        chain(ship_order.s(5), add.s()).apply_async()
        assert Job.objects.filter(task_name=add.name).count() == 4
        assert Job.objects.filter(key="ship/5").exists()

    def test_send_task_by_name_gets_its_intent_from_the_publish_hook(self, backend):
        """app.send_task skips apply_async; the hook writes the intent and the header."""
        app.send_task(ship_order.name, args=(99,))
        assert Job.objects.get(key="ship/99").state == "PENDING"

    def test_publish_hook_marks_a_bad_send_task_message(self, backend):
        """The hook cannot stop a message, so it marks it; the worker raises the error."""
        headers = {"task": ship_order.name, "id": "t-1"}
        on_before_task_publish(sender=ship_order.name, headers=headers,
                               body=([{"not": {"json"}}], {}, {}))
        assert headers[ERROR_HEADER]["type"] == "ArgumentsNotJSON"
        request = type("Request", (), {"headers": headers})()
        assert isinstance(refused_error(request), ArgumentsNotJSON)
        assert not Job.objects.exists()

    def test_direct_call_is_a_plain_function_call(self, backend):
        """Calling the task object runs the body, with its key, without claiming anything."""
        assert add(2, 3) == 5
        assert not Job.objects.exists()
        assert Effect.objects.get().key == add.intent((2, 3)).key
