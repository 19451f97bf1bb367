"""Key declarations: templates, callables, constants, and the errors for bad ones."""

from __future__ import annotations

import re

import pytest
from celery import Celery

from celery_idem import (
    ALL_ARGUMENTS,
    PER_CALL,
    ConfigurationError,
    IdempotentTask,
    InvalidKey,
    MissingKey,
)
from celery_idem.errors import ArgumentsNotJSON
from celery_idem.fingerprints import fingerprint
from celery_idem.keys import KEY_MAX_LENGTH, validate_key

app = Celery("keys-tests", set_as_current=False)


def make_task(fun, **options):
    """Create and register a task class right away, as a project's import would."""
    return app.task(base=IdempotentTask, bind=True, lazy=False, shared=False, **options)(fun)


def refused(fun, **options):
    """Create a misdeclared task (its creation raises nothing: one mistake must not stop
    the app's other tasks) and use it: its declaration's error, naming it."""
    return make_task(fun, **options).key_spec()


def ship(self, order_id, carrier="ups"):
    return order_id


class TestTemplates:
    def test_template_formats_bound_arguments_with_defaults(self):
        """A template sees positional and keyword arguments by name, defaults applied."""
        task = make_task(ship, name="t.tpl1", idempotency_key="ship/{order_id}/{carrier}")
        assert task.intent((42,)).key == "ship/42/ups"
        assert task.intent((), {"order_id": 7, "carrier": "dhl"}).key == "ship/7/dhl"

    def test_template_naming_an_unknown_parameter_fails_at_registration(self):
        """A typo in a template is a ConfigurationError naming the task, at its first use."""
        with pytest.raises(ConfigurationError, match="names 'order', which is not a parameter"):
            refused(ship, name="t.tpl2", idempotency_key="ship/{order}")

    def test_template_without_fields_is_refused(self):
        """A constant template would make every call share one key."""
        with pytest.raises(ConfigurationError, match="names no argument"):
            refused(ship, name="t.tpl3", idempotency_key="ship")

    def test_positional_template_fields_are_refused(self):
        """Fields must name parameters, not positions."""
        with pytest.raises(ConfigurationError, match="must name parameters"):
            refused(ship, name="t.tpl4", idempotency_key="ship/{0}")

    def test_template_may_index_into_a_dict_argument(self):
        """Format-spec indexing works on JSON arguments."""
        def pay(self, order):
            return order

        task = make_task(pay, name="t.tpl5", idempotency_key="pay/{order[id]}")
        assert task.intent(({"id": 9, "total": 3},)).key == "pay/9"

    def test_template_missing_a_dict_item_is_an_invalid_key(self):
        """A template that fails on the actual arguments raises InvalidKey at publish."""
        def pay(self, order):
            return order

        task = make_task(pay, name="t.tpl6", idempotency_key="pay/{order[id]}")
        with pytest.raises(InvalidKey, match="failed on these arguments"):
            task.intent(({"total": 3},))


class TestOtherSources:
    def test_callable_receives_the_task_arguments(self):
        """A callable key gets the call's own args and kwargs."""
        task = make_task(ship, name="t.call1",
                         idempotency_key=lambda order_id, carrier="ups": f"o{order_id}-{carrier}")
        assert task.intent((5,), {"carrier": "fedex"}).key == "o5-fedex"

    def test_callable_returning_a_non_string_is_an_invalid_key(self):
        """The callable's return value is validated like any key."""
        task = make_task(ship, name="t.call2", idempotency_key=lambda order_id, **_: order_id)
        with pytest.raises(InvalidKey, match="must be a str"):
            task.intent((5,))

    def test_all_arguments_key_is_the_fingerprint(self):
        """ALL_ARGUMENTS keys by the fingerprint of the bound arguments."""
        task = make_task(ship, name="t.all1", idempotency_key=ALL_ARGUMENTS)
        intent = task.intent((5,))
        assert intent.key == intent.fingerprint == fingerprint({"order_id": 5, "carrier": "ups"})
        assert task.intent((), {"order_id": 5}).key == intent.key

    def test_per_call_without_a_key_raises_missing_key(self):
        """A PER_CALL task refuses a call that brings no key."""
        task = make_task(ship, name="t.per1", idempotency_key=PER_CALL)
        with pytest.raises(MissingKey):
            task.intent((5,))
        assert task.intent((5,), key="manual-5").key == "manual-5"

    @pytest.mark.parametrize("builtin", ["map", "starmap", "chunks"])
    def test_per_call_items_of_a_builtin_map_are_refused_when_the_signature_is_made(
            self, builtin):
        """Celery's map, starmap and chunks call the body once per item, with no key to
        give it: refused when the signature is made, naming the ways out; a task whose
        arguments make its key gets its signature."""
        items = {"map": ([5],), "starmap": ([(5,)],), "chunks": ([(5,)], 1)}[builtin]
        per_call = make_task(ship, name=f"t.per-{builtin}", idempotency_key=PER_CALL)
        with pytest.raises(MissingKey, match=rf"its {builtin}\(\) would call it once per "
                                             r"item.*group.*ALL_ARGUMENTS"):
            getattr(per_call, builtin)(*items)
        keyed = make_task(ship, name=f"t.keyed-{builtin}", idempotency_key="ship/{order_id}")
        assert getattr(keyed, builtin)(*items).task.startswith("celery.")

    def test_a_task_that_declares_no_key_is_a_configuration_error(self):
        """Saying nothing is an error at registration, not a silent default."""
        with pytest.raises(ConfigurationError, match="declares no idempotency_key"):
            refused(ship, name="t.none")

    def test_unknown_idempotency_option_suggests_the_right_one(self):
        """A misspelt option fails with a hint instead of being ignored."""
        with pytest.raises(ConfigurationError, match="did you mean 'idempotency_key'"):
            refused(ship, name="t.typo", idempotency_keys="x/{order_id}")

    @pytest.mark.parametrize("option,value", [("on_in_progress", "wait"),
                                              ("on_stale_claim", "retry"),
                                              ("max_attempts", 0)])
    def test_bad_policy_values_fail_at_registration(self, option, value):
        """Policies are checked when the task class is created; its use raises, naming it."""
        with pytest.raises(ConfigurationError, match=f"t.bad.{option}"):
            refused(ship, name=f"t.bad.{option}", idempotency_key="s/{order_id}",
                    **{option: value})

    def test_class_based_task_is_checked_when_it_defines_run(self):
        """Abstract bases pass; a concrete class with run() must declare its key."""
        class Base(IdempotentTask):
            atomic = True

        class Concrete(Base):
            def run(self, x):
                return x

        with pytest.raises(ConfigurationError, match="Concrete.*declares no idempotency_key"):
            Concrete.key_spec()

        class Keyed(Base):
            idempotency_key = "k/{x}"

            def run(self, x):
                return x

        assert Keyed._key_spec.key({"x": 1}, (1,), {}) == "k/1"
        assert Keyed.idempotency_key == "k/{x}"


class TestValidateKey:
    @pytest.mark.parametrize("key", ["", "   ", None, 42, b"bytes", "x" * (KEY_MAX_LENGTH + 1)])
    def test_bad_keys_raise_invalid_key(self, key):
        """Keys are non-empty strings that fit the column."""
        with pytest.raises(InvalidKey):
            validate_key(key)

    def test_a_key_of_the_maximum_length_is_accepted(self):
        """The limit is inclusive."""
        assert validate_key("k" * KEY_MAX_LENGTH) == "k" * KEY_MAX_LENGTH

    @pytest.mark.parametrize("key", ["a\x00b", "\x00", "order/1\x00"])
    def test_a_nul_character_is_an_invalid_key(self, key):
        """PostgreSQL cannot store NUL in text: refused before any database write."""
        with pytest.raises(InvalidKey, match="NUL"):
            validate_key(key)

    def test_a_nul_from_a_per_call_key_or_a_callable_is_refused(self):
        """Every key source goes through the same check."""
        per_call = make_task(ship, name="t.nul1", idempotency_key=PER_CALL)
        with pytest.raises(InvalidKey, match="NUL"):
            per_call.intent((5,), key="k\x00")
        from_callable = make_task(ship, name="t.nul2",
                                  idempotency_key=lambda order_id, **_: f"o\x00{order_id}")
        with pytest.raises(InvalidKey, match="NUL"):
            from_callable.intent((5,))

    def test_a_nul_in_an_argument_a_template_uses_is_refused_as_arguments(self):
        """The arguments are checked first (their fingerprint), so the error names them."""
        task = make_task(ship, name="t.nul3", idempotency_key="ship/{order_id}")
        with pytest.raises(ArgumentsNotJSON, match=r"\['order_id'\] contains a NUL"):
            task.intent(("a\x00b",))


class TestBind:
    """``KeySpec.bind``'s fast path binds exactly as ``inspect.Signature.bind`` would."""

    BODIES = [lambda a, b: 0, lambda a, b=2, *, c, d=4: 0, lambda a=1: 0, lambda: 0,
              lambda *, k: 0, lambda a, b, c=3: 0]

    @pytest.mark.parametrize("body", BODIES)
    def test_every_call_binds_as_inspect_does_or_fails_as_it_does(self, body):
        """Every mix of 0-4 positional arguments and up to 3 keywords (known, unknown,
        repeated): the same arguments in the same order, or inspect's own TypeError."""
        import inspect
        import itertools

        from celery_idem.keys import KeySpec

        signature = inspect.signature(body)
        spec = KeySpec("t.bind", PER_CALL, signature)
        assert spec._simple is not None
        names = ["a", "b", "c", "d", "k", "z"]
        for n, size in itertools.product(range(5), range(4)):
            for keywords in itertools.combinations(names, size):
                args, kwargs = tuple(range(10, 10 + n)), {k: k.upper() for k in keywords}
                try:
                    expected = signature.bind(*args, **kwargs)
                except TypeError as exc:
                    with pytest.raises(TypeError, match=re.escape(str(exc))):
                        spec.bind(args, kwargs)
                    continue
                expected.apply_defaults()
                assert list(spec.bind(args, kwargs).items()) == list(
                    expected.arguments.items())

    def test_variadic_and_positional_only_bodies_use_inspect(self):
        import inspect

        from celery_idem.keys import KeySpec

        for body in (lambda *a: 0, lambda a, /: 0, lambda **k: 0):
            spec = KeySpec("t.bind", PER_CALL, inspect.signature(body))
            assert spec._simple is None
        spec = KeySpec("t.bind", PER_CALL, inspect.signature(lambda a, *rest, k=1: 0))
        assert spec.bind((1, 2, 3), {}) == {"a": 1, "rest": (2, 3), "k": 1}


def test_an_untyped_task_keeps_arguments_that_do_not_fit_as_given():
    untyped = make_task(ship, idempotency_key=ALL_ARGUMENTS, typing=False, name="untyped-all")
    intent = untyped.intent((), {"wrong": 1})
    assert intent.fingerprint == fingerprint({"*": [], "**": {"wrong": 1}})
    assert untyped.intent((7,)).fingerprint == untyped.intent(kwargs={"order_id": 7}).fingerprint


def test_an_untyped_template_key_over_arguments_that_do_not_fit_is_invalid():
    untyped = make_task(ship, idempotency_key="ship/{order_id}", typing=False,
                        name="untyped-template")
    with pytest.raises(InvalidKey, match="failed on these arguments"):
        untyped.intent((), {"wrong": 1})


def test_a_typed_task_refuses_arguments_that_do_not_fit():
    with pytest.raises(TypeError):
        make_task(ship, idempotency_key=ALL_ARGUMENTS, name="typed-all").intent((), {"wrong": 1})
