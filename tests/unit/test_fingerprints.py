"""Canonical JSON and fingerprints: what a JSON round trip cannot tell apart is equal."""

from __future__ import annotations

import datetime
import decimal
import json

import pytest

from celery_idem.errors import ArgumentsNotJSON
from celery_idem.fingerprints import canonical_json, fingerprint


def test_dict_order_does_not_change_the_fingerprint():
    """Keys are sorted, at every depth."""
    left = {"a": 1, "b": {"y": 2, "x": 1}}
    assert fingerprint(left) == fingerprint({"b": {"x": 1, "y": 2}, "a": 1})


def test_tuples_and_lists_have_the_same_fingerprint():
    """The broker turns tuples into lists, so the producer must not tell them apart."""
    assert fingerprint({"items": (1, 2, (3,))}) == fingerprint({"items": [1, 2, [3]]})


def test_unicode_is_kept_as_is_and_distinct_strings_differ():
    """Non-ASCII text is not escaped, and é (NFC) differs from e + combining accent."""
    assert canonical_json({"name": "Zoë"}) == '{"name":"Zoë"}'
    assert fingerprint("\u00e9") != fingerprint("e\u0301")


def test_canonical_json_is_compact_and_round_trips():
    """No whitespace; parsing it gives the value back."""
    value = {"b": [1, 2.5, None, True], "a": "x"}
    text = canonical_json(value)
    assert text == '{"a":"x","b":[1,2.5,null,true]}'
    assert json.loads(text) == value


def test_different_values_have_different_fingerprints():
    """1 and "1" and 1.5 are three arguments."""
    assert len({fingerprint(1), fingerprint("1"), fingerprint(1.5)}) == 3


@pytest.mark.parametrize("value,where", [
    ({"when": datetime.datetime(2026, 1, 1)}, "['when']"),
    ({"price": decimal.Decimal("1.10")}, "['price']"),
    ([1, {2, 3}], "[1]"),
    ({"x": float("nan")}, "['x']"),
    ({"x": float("inf")}, "['x']"),
    ({1: "non-string key"}, "key 1"),
    (object(), "arguments"),
])
def test_values_json_cannot_carry_are_refused_with_their_path(value, where):
    """A clear ArgumentsNotJSON names the offending place."""
    with pytest.raises(ArgumentsNotJSON) as info:
        fingerprint(value)
    assert where in str(info.value)
    assert isinstance(info.value, TypeError)


@pytest.mark.parametrize("value,where", [
    ("a\x00b", "arguments contains a NUL"),
    ({"note": "x\x00"}, "arguments['note'] contains a NUL"),
    ({"a\x00": 1}, "a key of arguments contains a NUL"),
    ({"deep": [1, {"k": ["ok", "\x00"]}]}, "arguments['deep'][1]['k'][1] contains a NUL"),
])
def test_a_nul_character_anywhere_is_refused(value, where):
    """PostgreSQL cannot store \\u0000 in text or jsonb: ArgumentsNotJSON names the place,
    before any database write (so the caller's transaction is untouched)."""
    with pytest.raises(ArgumentsNotJSON) as info:
        fingerprint(value)
    assert where in str(info.value)


def test_other_control_characters_are_kept():
    """Only NUL is refused; tabs, newlines and other control characters are stored."""
    assert json.loads(canonical_json(["a\tb\n\x01"])) == ["a\tb\n\x01"]


def test_a_model_instance_suggests_passing_its_primary_key():
    """The most common mistake gets the most useful hint."""
    from django_app.effects.models import Effect

    with pytest.raises(ArgumentsNotJSON, match=r"Effect model instance.*effect\.pk"):
        fingerprint({"effect": Effect(key="k")})
