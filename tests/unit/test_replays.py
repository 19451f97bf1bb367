"""Which replays someone would see (celery_idem.replays.seen): a stored result, a canvas
carried in the body, a group. No services: the message's parts as Celery builds them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from celery import Celery
from celery.backends.base import DisabledBackend

from celery_idem.replays import seen

app = Celery(set_as_current=False, backend="cache+memory://")
BODY = ((1,), {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None})


def task(ignore_result: bool = False, backend: object | None = None) -> SimpleNamespace:
    return SimpleNamespace(ignore_result=ignore_result, backend=backend or app.backend)


@pytest.mark.parametrize(("ignore_task", "header", "expected"), [
    (False, False, True),
    (False, None, True),
    (True, None, False),
    (True, True, False),
    (False, True, False),
    # The call asked for the result: stored on Celery 5.7 (not on 5.5): sent.
    (True, False, True),
])
def test_the_result_is_seen_unless_the_header_or_the_task_ignores_it(ignore_task, header,
                                                                     expected):
    headers = {} if header is None else {"ignore_result": header}
    assert seen(task(ignore_task), BODY, headers) is expected


def test_without_a_result_backend_no_result_is_seen():
    assert seen(task(backend=DisabledBackend(app)), BODY, {"ignore_result": False}) is False


@pytest.mark.parametrize("part", ["callbacks", "chain", "chord"])
def test_a_canvas_in_the_body_is_seen_even_with_the_result_ignored(part):
    args, kwargs, embed = BODY
    body = (args, kwargs, {**embed, part: [{"task": "next"}]})
    assert seen(task(True), body, {"ignore_result": True}) is True


def test_an_errback_alone_is_not_seen_by_a_success():
    args, kwargs, embed = BODY
    body = (args, kwargs, {**embed, "errbacks": [{"task": "on_error"}]})
    assert seen(task(True), body, {"ignore_result": True}) is False


def test_a_group_member_is_seen():
    assert seen(task(True), BODY, {"ignore_result": True, "group": "g-1"}) is True
