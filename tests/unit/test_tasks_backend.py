"""celery_idem.tasks_backend without a database or a broker: declarations, what an
enqueue refuses before anything is written, the routing of a message, a job row read as
a TaskResult, and the system checks. Django 6.0+ (django.tasks); the real workers are
tests/integration/test_django_tasks.py's."""

from __future__ import annotations

import sys
import types
import warnings
from dataclasses import fields
from datetime import UTC, datetime, timedelta

import django
import pytest

if django.VERSION < (6, 0):
    pytest.skip("Django's Tasks framework (django.tasks) is Django 6.0+: the newest and "
                "django60 tiers run these", allow_module_level=True)

from celery import _state, current_app
from django.tasks import Task, TaskResultStatus, task_backends
from django.tasks.exceptions import InvalidTask
from django.test import override_settings

from celery_idem import IdempotentTask, checks
from celery_idem.declaration import OPTIONS
from celery_idem.djangotasks import adapter, discovery, results
from celery_idem.errors import ConfigurationError, InvalidKey, Uncertain
from celery_idem.tasks_backend import CeleryIdemBackend, CeleryIdemTask, celery_priority, task
from django_app.effects import django_tasks

from .projects import manage_py_check, project_files

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def module(monkeypatch):
    """A fresh module ``throwaway_tasks`` to declare tasks in; they leave this process's
    registries (the adapters, the Celery app's tasks and shared tasks) afterwards."""
    monkeypatch.setattr(_state, "_on_app_finalizers", set(_state._on_app_finalizers))
    monkeypatch.setattr(adapter, "DECLARED", dict(adapter.DECLARED))
    monkeypatch.setattr(discovery, "DECLARED", adapter.DECLARED)
    monkeypatch.setattr(current_app, "_tasks", current_app._tasks)
    before = set(current_app.tasks)
    mod = types.ModuleType("throwaway_tasks")
    sys.modules[mod.__name__] = mod
    yield mod
    del sys.modules[mod.__name__]
    for name in set(current_app.tasks) - before:
        del current_app.tasks[name]


def identity(n):
    return n


def declare(module, source: str) -> None:
    exec(f"from celery_idem.tasks_backend import task\n{source}", module.__dict__)


class TestDeclaring:
    def test_djangos_and_the_backends_decorators_make_its_task_class(self):
        """Django 6.1's @task takes the backend's options (6.0: the backend's task())."""
        assert isinstance(django_tasks.ship, CeleryIdemTask)
        assert django_tasks.ship.idempotency_key == "dt-ship/{order_id}"
        assert django_tasks.wait_for_file_atomic.atomic is True

    def test_every_declared_task_has_an_adapter_named_by_its_module_path(self):
        """The Celery task the worker runs: IdempotentTask options, the function's own
        parameters (without ``context``), results read from the job, not stored."""
        celery_task = current_app.tasks["django_app.effects.django_tasks.ship"]
        assert celery_task.declaration is django_tasks.ship
        assert str(celery_task.key_spec().signature) == "(order_id, hold=0.0)"
        assert celery_task.namespace == django_tasks.ship.module_path
        assert celery_task.ignore_result is True and celery_task.atomic is False
        assert current_app.tasks[django_tasks.wait_for_file_atomic.module_path].atomic

    def test_the_task_class_takes_every_option_of_idempotent_task(self):
        """Each of IdempotentTask's options is a field; one not given is its default."""
        assert OPTIONS <= {field.name for field in fields(CeleryIdemTask)}
        celery_task = current_app.tasks[django_tasks.ship.module_path]
        assert (celery_task.on_in_progress, celery_task.on_stale_claim) == (
            IdempotentTask.on_in_progress, IdempotentTask.on_stale_claim)

    def test_using_gives_a_call_its_own_key_and_checks_it(self):
        keyed = django_tasks.notify.using(idempotency_key="greeting/1", priority=10)
        assert (keyed.call_key, keyed.priority) == ("greeting/1", 10)
        assert django_tasks.notify.call_key is None
        with pytest.raises(InvalidKey):
            django_tasks.notify.using(idempotency_key=" ")

    def test_a_task_of_another_class_is_refused(self):
        with pytest.raises(InvalidTask, match="its own task class"):
            Task(func=django_tasks.notify.func, backend="default", priority=0,
                 queue_name="default", run_after=None)

    def test_an_atomic_async_task_is_refused(self, module):
        with pytest.raises(InvalidTask, match="atomic task must be a plain function"):
            declare(module, "@task(idempotency_key='o/{n}', atomic=True)\n"
                            "async def run(n):\n    return n\n")

    def test_an_optimistic_task_is_refused(self, module):
        """Its result and signals read the claim an optimistic body runs without."""
        with pytest.raises(InvalidTask, match="atomic='optimistic' is for Celery tasks"):
            declare(module, "@task(idempotency_key='o/{n}', atomic='optimistic')\n"
                            "def run(n):\n    return n\n")

    def test_the_backends_decorator_refuses_another_backend(self):
        tasks = {"default": {"BACKEND": "celery_idem.tasks_backend.CeleryIdemBackend"},
                 "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}
        with override_settings(TASKS=tasks), pytest.raises(ConfigurationError,
                                                           match="TASKS\\['immediate'\\]"):
            task(backend="immediate", idempotency_key="x/{n}")(django_tasks.notify.func)

    def test_options_are_refused(self):
        with pytest.raises(ConfigurationError, match="OPTIONS \\['MODULES'\\]"):
            CeleryIdemBackend("default", {"OPTIONS": {"MODULES": ["x"]}})


class TestEnqueueRefuses:
    """Each raises before anything is written or sent (no database, no broker here)."""

    def test_a_task_declaring_no_key(self, module, monkeypatch):
        monkeypatch.setattr(task_backends["default"], "_worker_modules",
                            frozenset({module.__name__}))  # as if in CELERY_IMPORTS
        declare(module, "@task\ndef nokey(n):\n    return n\n")
        with pytest.raises(ConfigurationError, match="throwaway_tasks.nokey declares no "
                                                     "idempotency_key"):
            module.nokey.enqueue(1)

    def test_a_task_the_worker_would_not_import(self, module):
        declare(module, "@task(idempotency_key='o/{n}')\ndef elsewhere(n):\n    return n\n")
        with pytest.raises(ConfigurationError, match="module throwaway_tasks, which the "
                                                     "worker does not import.*CELERY_IMPORTS"):
            module.elsewhere.enqueue(1)
        (message,) = discovery.check(current_app)
        assert message.id == "celery_idem.E050" and "throwaway_tasks.elsewhere" in message.msg

    def test_a_task_whose_name_a_celery_task_has(self, module, monkeypatch):
        monkeypatch.setattr(task_backends["default"], "_worker_modules",
                            frozenset({module.__name__}))
        current_app.task(name="throwaway_tasks.clash")(identity)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Celery 5.7 warns of the duplicate name too
            declare(module, "@task(idempotency_key='o/{n}')\ndef clash(n):\n    return n\n")
        with pytest.raises(ConfigurationError, match="shares its name with the Celery task"):
            module.clash.enqueue(1)

    def test_anything_under_broker_durability(self, settings):
        settings.CELERY_IDEM_DURABILITY = "broker"
        with pytest.raises(ConfigurationError, match="CELERY_IDEM_DURABILITY = 'database'"):
            django_tasks.ship.enqueue(1)
        (message,) = checks._check_django_tasks_durability()
        assert message.id == "celery_idem.E051" and "default" in message.msg


class TestRouting:
    @pytest.mark.parametrize(("priority", "rabbitmq", "redis"), [
        (-100, 0, 9), (-80, 0, 9), (-79, 1, 8), (0, 4, 5), (1, 5, 4), (81, 9, 0), (100, 9, 0)])
    def test_priority_maps_onto_each_brokers_direction(self, priority, rabbitmq, redis):
        assert celery_priority(priority, "amqp://guest@localhost//") == rabbitmq
        assert celery_priority(priority, "redis://localhost:6379/0") == redis
        assert celery_priority(priority, "filesystem://") is None

    def test_queue_priority_and_run_after_become_apply_async_options(self):
        """Django's "default" queue is Celery's routing (task_routes, the default queue)."""
        later = NOW + timedelta(hours=1)
        backend = task_backends["default"]
        redis = "redis://localhost/0"
        assert backend._routing(django_tasks.ship, redis) == {"priority": 5}
        assert backend._routing(django_tasks.ship.using(
            queue_name="other", priority=100, run_after=later), redis) == {
                "queue": "other", "priority": 0, "eta": later}
        assert backend._routing(django_tasks.ship, "filesystem://") == {}


def row(**values) -> dict:
    base = {"id": 7, "namespace": "ns", "key": "k/1", "task_name": "t", "state": "PENDING",
            "attempt": 0, "worker": "", "args": [1], "kwargs": {}, "result": None,
            "error": None, "created_at": NOW, "started_at": None, "finished_at": None,
            "updated_at": NOW}
    return base | values


class TestResults:
    def build(self, lines=(), **values):
        return results.build(django_tasks.ship, "default", row(**values), list(lines))

    def test_the_result_id_is_the_jobs_id_and_a_digest_of_its_key(self):
        result = self.build()
        assert result.id.startswith("7-") and len(result.id) == 2 + results.DIGEST_LENGTH
        assert self.build(key="k/2").id != result.id

    def test_each_state_maps_to_djangos_status(self):
        started = NOW + timedelta(seconds=1)
        ran = {"attempt": 1, "worker": "w@h/1", "started_at": started}
        assert self.build().status == TaskResultStatus.READY
        assert self.build(state="RUNNING", **ran).status == TaskResultStatus.RUNNING
        done = self.build(state="SUCCEEDED", result={"x": 1}, finished_at=started, **ran)
        assert (done.status, done.return_value, done.worker_ids) == (
            TaskResultStatus.SUCCESSFUL, {"x": 1}, ["w@h/1"])
        assert done.enqueued_at == NOW and done.finished_at == started
        for state in ("FAILED", "EXPIRED", "UNCERTAIN"):
            assert self.build(state=state, **ran).status == TaskResultStatus.FAILED

    def test_a_failure_has_its_class_path_and_traceback(self):
        error = {"type": "ValueError", "module": "builtins", "message": "boom",
                 "traceback": "Traceback ...\nValueError: boom\n"}
        (failure,) = self.build(state="FAILED", error=error, attempt=1, worker="w").errors
        assert failure.exception_class is ValueError and failure.traceback == error["traceback"]
        expired = {"type": "Expired", "module": "celery_idem.errors", "message": "m",
                   "traceback": ""}
        (gone,) = self.build(state="EXPIRED", error=expired).errors
        assert gone.exception_class_path == "celery_idem.errors.Expired"
        assert gone.traceback == "celery_idem.errors.Expired: m\n"

    def test_uncertain_says_so_with_the_reason_it_was_left_to_an_operator(self):
        lines = [("uncertain", 1, "w@h/1", NOW, "worker lost; must not re-run blindly")]
        result = self.build(lines, state="UNCERTAIN", attempt=1, worker="")
        (error,) = result.errors
        assert error.exception_class is Uncertain and "must not re-run blindly" in error.traceback
        assert result.finished_at == NOW and result.worker_ids == ["w@h/1"]

    def test_one_worker_id_per_attempt_from_the_history(self):
        """A released attempt, a taken-over one (its worker unknown: ""), the last."""
        first, second = NOW - timedelta(minutes=5), NOW - timedelta(minutes=1)
        lines = [("released", 1, "w@a/1", first, "worker lost"),
                 ("redispatched", 1, "", None, "sent again"),
                 ("taken_over", 3, "w@c/3", second, "stale claim")]
        result = self.build(lines, state="SUCCEEDED", attempt=3, worker="w@c/3",
                            started_at=NOW, finished_at=NOW)
        assert result.worker_ids == ["w@a/1", "", "w@c/3"] and result.attempts == 3
        assert (result.started_at, result.last_attempted_at) == (first, NOW)


TASKS_PROJECT = {
    **project_files("tasksproj", (
        "ROOT_URLCONF = 'shop.urls'\n"
        "TASKS = {'default': {'BACKEND': 'celery_idem.tasks_backend.CeleryIdemBackend'}}\n"
        "CELERY_IDEM_DURABILITY = 'broker'\n")),
    "shop/tasks.py": (
        "from celery_idem.tasks_backend import task\n\n"
        "@task\ndef charge(order_id):\n    return order_id\n\n"
        "@task(idempotency_key='ok/{order_id}')\ndef fine(order_id):\n    return order_id\n"
    ),
    # Imported by the URL configuration, which the checks import; not by the worker.
    "shop/jobs.py": (
        "from celery_idem.tasks_backend import task\n\n"
        "@task(idempotency_key='report/{day}')\ndef report(day):\n    return day\n"
    ),
    "shop/urls.py": "from . import jobs  # noqa: F401\nurlpatterns = []\n",
}


def test_manage_py_check_reports_a_project_whose_django_tasks_would_fail(tmp_path):
    """A fresh process, as manage.py check runs: a Django task declaring no key is E001, one
    the worker would not import E050, broker durability E051; the good one passes."""
    done = manage_py_check(tmp_path, TASKS_PROJECT, "tasksproj")
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if "celery_idem.E0" in line]
    assert len(errors) == 3, done.stderr
    assert any("E001" in e and "shop.tasks.charge declares no idempotency_key" in e
               for e in errors)
    assert any("E050" in e and "shop.jobs.report" in e for e in errors)
    assert any("E051" in e for e in errors)
