"""A pytest plugin for Celery's own integration suite (``-p tests.compat.plugin``; loaded
by tests/compat/suite.py in every run, ``IDEM_COMPAT_KEYS`` naming the key kind, empty for
plain Celery).

In every run, each test's timeout is ``IDEM_COMPAT_TIMEOUT`` seconds (tests/compat/suite.py
sets it): Celery's ``@flaky`` tests carry a ``timeout(300)`` marker of their own, which
would let a hang cost five minutes.

With a key kind, every task of the suite gets ``celery_idem.IdempotentTask`` as its base.
The suite builds its app from ``celery.contrib.pytest``'s ``celery_parameters`` fixture,
so ``task_cls`` goes there; its tasks are ``shared_task``s without a ``base``, so each
becomes a subclass of the app's ``Task``, i.e. of ``CompatTask`` below. The key kinds, as
the README recommends them:

- ``per_call``: ``PER_CALL``; each publish of the test itself (the pytest process's main
  thread or its executor's threads, outside any body: ``apply_async`` and
  ``app.send_task``) gets a fresh key, as a caller passing ``idempotency_key=`` (or the
  ``celery_idem_key`` header) would. Whatever Celery publishes elsewhere (a worker, the
  result backend) gets no help here: that is the extension's job.
- ``template``: a template over the task's named parameters (``"{x}/{y}"``); a task with
  none (only ``*args``/``**kwargs``, or no parameters) is ``PER_CALL`` as above, which is
  what the extension's error for a template naming nothing tells a user to do.
- ``all_arguments``: ``ALL_ARGUMENTS``.

Each of Celery's tests starts with no job (the job tables are emptied after each, once
the suite's own ``manager`` fixture has waited for the worker to be idle): Celery's tests
are independent scenarios, and with a template or ``ALL_ARGUMENTS`` the same call made by
an earlier test (``add(2, 2)``, ``identity(42)``) would otherwise replay that test's result,
making each outcome depend on which tests ran before it (the CI subset or ``--full``).
Within one test, every duplicate still meets the job it duplicates.

Django runs on a database of its own (``IDEM_PG_NAME``), created and migrated when the
plugin is configured and dropped at the end, before the suite's session worker forks.
"""

from __future__ import annotations

import functools
import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

KINDS = ("per_call", "template", "all_arguments")
_PYTEST_PID = os.getpid()
_KIND = pytest.StashKey[str]()
_DATABASE = pytest.StashKey[str]()


def template_for(run: Any) -> str | None:
    """A key template naming each named parameter of a task body; None if it has none."""
    from celery_idem.keys import body_signature

    named = [p.name for p in body_signature(run).parameters.values()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return "/".join(f"{{{name}}}" for name in named) or None


def _top_level() -> bool:
    """A publish by the test itself (its main thread, or the threads of an executor it
    started: test_concurrent_apply_async_with_timeout publishes from twenty), not by the
    worker's threads or pool processes."""
    thread = threading.current_thread()
    return os.getpid() == _PYTEST_PID and (
        thread is threading.main_thread() or thread.name.startswith("ThreadPoolExecutor-"))


def _wants_a_key(task: Any) -> bool:
    """A publish of a ``PER_CALL`` task by the test itself, which a caller would give a key."""
    return _top_level() and hasattr(task, "key_spec") and task.key_spec().per_call


def _fresh_key() -> str:
    return f"compat/{uuid.uuid4()}"


def _send_task_with_a_key(app: Any) -> Any:
    """``app.send_task`` giving a top-level ``PER_CALL`` message a fresh key in the
    ``celery_idem_key`` header, as the README tells a caller to (the extension wraps only
    the app current when Django starts; the suite makes an app per test)."""
    from celery_idem.producer import KEY_HEADER

    send_task = app.send_task

    @functools.wraps(send_task)
    def keyed(name: str, *args: Any, headers: dict[str, Any] | None = None,
              **options: Any) -> Any:
        headers = dict(headers or {})
        if KEY_HEADER not in headers and _wants_a_key(app.tasks.get(name)):
            headers[KEY_HEADER] = _fresh_key()
        return send_task(name, *args, headers=headers, **options)

    return keyed


def task_class(kind: str) -> type:
    """The base of every task of the suite for one key kind."""
    from celery_idem import ALL_ARGUMENTS, PER_CALL, IdempotentTask

    class CompatTask(IdempotentTask):  # type: ignore[misc]
        idempotency_key = ALL_ARGUMENTS if kind == "all_arguments" else PER_CALL

        def __init_subclass__(cls, **kwargs: Any) -> None:
            if kind == "template" and "run" in cls.__dict__ \
                    and "idempotency_key" not in cls.__dict__:
                cls.idempotency_key = template_for(cls.__dict__["run"]) or PER_CALL
            super().__init_subclass__(**kwargs)

        def apply_async(self, args: Any = None, kwargs: Any = None, *rest: Any,
                        idempotency_key: str | None = None, **options: Any) -> Any:
            if idempotency_key is None and _wants_a_key(self):
                idempotency_key = _fresh_key()
            return super().apply_async(args, kwargs, *rest, idempotency_key=idempotency_key,
                                       **options)

    return CompatTask


def pytest_configure(config: pytest.Config) -> None:
    kind = os.environ.get("IDEM_COMPAT_KEYS", "")
    if kind and kind not in KINDS:
        raise pytest.UsageError(f"IDEM_COMPAT_KEYS must be empty or one of {KINDS}, not {kind!r}")
    config.stash[_KIND] = kind
    if not kind:
        return
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_app.settings")
    import django

    django.setup()
    from django.db import connection

    import celery_idem.tasks  # noqa: F401 - celery_idem.replaced, as a worker has it

    config.stash[_DATABASE] = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _DATABASE not in config.stash:
        return
    from django.db import connection

    from celery_idem import connection as bookkeeping

    bookkeeping.close_bookkeeping_connections()
    connection.creation.destroy_test_db(config.stash[_DATABASE], verbosity=0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seconds = int(os.environ["IDEM_COMPAT_TIMEOUT"])
    for item in items:
        item.add_marker(pytest.mark.timeout(seconds), append=False)


@pytest.fixture(scope="session")
def celery_parameters(request: pytest.FixtureRequest) -> dict[str, Any]:
    kind = request.config.stash[_KIND]
    return {"task_cls": task_class(kind)} if kind else {}


@pytest.fixture(scope="session", autouse=True)
def _every_task_idempotent(request: pytest.FixtureRequest, celery_session_app: Any) -> None:
    """Stop the run, rather than let it pass as plain Celery, if the suite's app did not
    take ``task_cls``."""
    if not request.config.stash[_KIND]:
        return
    from celery_idem import IdempotentTask

    if not isinstance(celery_session_app.tasks["t.integration.tasks.add"], IdempotentTask):
        pytest.exit("the suite's tasks are not IdempotentTask subclasses: "
                    "tests/compat/plugin.py's celery_parameters was not used", 3)


@pytest.fixture(autouse=True)
def _keyed_send_task(request: pytest.FixtureRequest, celery_app: Any) -> None:
    if request.config.stash[_KIND]:
        celery_app.send_task = _send_task_with_a_key(celery_app)


@pytest.fixture(autouse=True)
def _no_job_from_an_earlier_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Empty the job tables after each test (autouse: set up before, torn down after the
    suite's ``manager``, which waits for the worker to be idle)."""
    yield
    if not request.config.stash[_KIND]:
        return
    from django.apps import apps
    from django.core.management.color import no_style
    from django.db import connection

    tables = [model._meta.db_table for model in apps.get_app_config("celery_idem").get_models()]
    with connection.cursor() as cursor:
        for statement in connection.ops.sql_flush(no_style(), tables, allow_cascade=True):
            cursor.execute(statement)
