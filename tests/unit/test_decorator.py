"""``celery_idem.task(key=..., **options)``: Celery's own declaration with
IdempotentTask as the base and the key as ``idempotency_key``; a misdeclared key
refuses that task alone, as for any IdempotentTask."""

from __future__ import annotations

import pytest
from celery import Celery

import celery_idem
from celery_idem import ALL_ARGUMENTS, PER_CALL, ConfigurationError, IdempotentTask, decorator

app = Celery("declaration-tests", set_as_current=False)


def declared(**options):
    """A task made by celery_idem.task on this module's app."""
    def ship(order_id, hold=0.0):
        return order_id

    return celery_idem.task(app=app, **options)(ship)


def test_it_is_an_idempotent_task_on_the_app_with_the_key_declared():
    declared(key="ship/{order_id}", name="t.decl.plain")
    task = app.tasks["t.decl.plain"]
    assert isinstance(task, IdempotentTask)
    assert type(task).idempotency_key == "ship/{order_id}"
    assert task.key_spec().source == "ship/{order_id}"


def test_bind_defaults_to_false_as_in_celery_and_can_be_asked_for():
    unbound = declared(key="ship/{order_id}", name="t.decl.unbound")
    assert unbound.run(7) == 7  # no ``self``: the body takes the arguments alone

    def ship(self, order_id):
        return self.name, order_id

    bound = celery_idem.task(app=app, key="ship/{order_id}", bind=True,
                             name="t.decl.bound")(ship)
    assert bound.run(7) == ("t.decl.bound", 7)


@pytest.mark.parametrize("key", [ALL_ARGUMENTS, PER_CALL, lambda order_id, hold=0.0: "k"],
                         ids=["all-arguments", "per-call", "callable"])
def test_key_takes_whatever_idempotency_key_takes(key):
    task = declared(key=key, name=f"t.decl.key.{id(key)}")
    assert task.key_spec().source is key


def test_options_go_to_the_task_as_given():
    task = declared(key="ship/{order_id}", name="t.decl.options", atomic=True,
                    max_attempts=3, queue="shipping", on_in_progress="ignore",
                    idempotency_namespace="shipping")
    assert (task.atomic, task.max_attempts, task.queue, task.on_in_progress,
            task.namespace) == (True, 3, "shipping", "ignore", "shipping")


def test_without_app_it_is_celerys_shared_task_with_the_base_and_the_key(monkeypatch):
    made = []

    def shared_task(**options):
        made.append(options)
        return lambda fn: ("shared", fn)

    monkeypatch.setattr(decorator, "shared_task", shared_task)

    def ship(order_id):
        return order_id

    assert celery_idem.task(key="ship/{order_id}", queue="q")(ship) == ("shared", ship)
    assert made == [{"base": IdempotentTask, "idempotency_key": "ship/{order_id}",
                     "queue": "q"}]


def test_a_bare_decorator_refuses_that_task_alone_with_the_missing_key_error():
    """The message IdempotentTask gives a class without idempotency_key; the app still
    finalizes and its other tasks are untouched."""
    def refresh():
        return None

    bare = celery_idem.task(app=app, name="t.decl.bare")(refresh)
    with pytest.raises(ConfigurationError, match=r"t\.decl\.bare.*idempotency_key"):
        bare.key_spec()
    good = declared(key="ship/{order_id}", name="t.decl.beside_bare")
    assert good.key_spec().source == "ship/{order_id}"


def test_a_key_that_does_not_fit_the_function_refuses_that_task_by_name():
    typo = declared(key="ship/{order_no}", name="t.decl.typo")
    with pytest.raises(ConfigurationError, match=r"t\.decl\.typo.*order_no"):
        typo.key_spec()


@pytest.mark.parametrize("call, message", [
    (lambda: celery_idem.task("ship/{order_id}"), "takes the key by name"),
    (lambda: celery_idem.task(key="a/{order_id}", idempotency_key="b/{order_id}"),
     "not idempotency_key="),
    (lambda: celery_idem.task(key="a/{order_id}", base=object), "subclass"),
], ids=["positional-key", "key-twice", "foreign-base"])
def test_misuse_is_a_configuration_error_naming_the_fix(call, message):
    with pytest.raises(ConfigurationError, match=message):
        call()
