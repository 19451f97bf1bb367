"""System checks: each fires on a project that has the problem and not on one that does not.

The Celery app the checks read is a throwaway one per test (``celery_app`` below), so a
broken task declared here never reaches the project's app.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from celery import Celery, _state
from django.conf import settings
from django.test import override_settings

from celery_idem import IdempotentTask, checks, checks_settings
from celery_idem.errors import ConfigurationError
from django_app.effects.tasks import ship_order

from .projects import manage_py_check, project_files

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def celery_app(monkeypatch):
    """An unfinalized app with good settings, read by the checks instead of the project's;
    the shared-task registry is restored afterwards."""
    app = Celery("checks-tests", set_as_current=False)
    app.conf.task_acks_late = True
    app.conf.task_reject_on_worker_lost = True
    # The modules the project's workers import (its Django tasks', on Django 6: E050).
    app.conf.imports = getattr(settings, "CELERY_IMPORTS", ())
    monkeypatch.setattr(checks, "_celery_app", lambda: app)
    monkeypatch.setattr(_state, "_on_app_finalizers", set(_state._on_app_finalizers))
    return app


def ids(messages) -> list[str]:
    return sorted(m.id for m in messages)


def body(self, order_id):
    return order_id


def shared_like(fun, **options):
    """What ``@shared_task`` registers: the class is created when an app finalizes."""
    _state.connect_on_app_finalize(lambda app: app._task_from_fun(fun, **options))


class TestTaskDeclarations:
    def test_a_shared_task_without_a_key_is_e001_naming_the_task(self, celery_app):
        """manage.py check reports what would stop the worker, for each broken task."""
        shared_like(body, base=IdempotentTask, bind=True, name="tests.nokey")
        shared_like(body, base=IdempotentTask, bind=True, name="tests.badtpl",
                    idempotency_key="o/{order}")
        messages = checks.check_tasks()
        assert ids(messages) == ["celery_idem.E001", "celery_idem.E001"]
        text = " ".join(m.msg for m in messages)
        assert "tests.nokey" in text and "declares no idempotency_key" in text
        assert "tests.badtpl" in text and "'order', which is not a parameter" in text
        assert all(m.hint for m in messages)

    def test_a_pending_app_task_with_a_bad_option_is_e001(self, celery_app):
        """``@app.task`` on an app not yet finalized is checked too."""
        celery_app.task(base=IdempotentTask, bind=True, name="tests.badpolicy",
                        idempotency_key="o/{order_id}", on_stale_claim="retry")(body)
        messages = checks.check_tasks()
        assert ids(messages) == ["celery_idem.E001"]
        assert "tests.badpolicy" in messages[0].msg

    def test_well_declared_tasks_pass(self, celery_app):
        shared_like(body, base=IdempotentTask, bind=True, name="tests.good",
                    idempotency_key="o/{order_id}")
        celery_app.task(base=IdempotentTask, bind=True, name="tests.good2",
                        idempotency_key="o/{order_id}", atomic=True)(body)
        assert checks.check_tasks() == []

    def test_atomic_tasks_off_the_default_database_are_e004(self, celery_app, monkeypatch):
        """atomic=True with the job tables on another alias: the body's writes on default
        would survive a failure, so it is an error with a way to silence it."""
        celery_app.task(base=IdempotentTask, bind=True, name="tests.atomic",
                        idempotency_key="o/{order_id}", atomic=True)(body)
        celery_app.task(base=IdempotentTask, bind=True, name="tests.plain",
                        idempotency_key="p/{order_id}")(body)
        # A second alias to the same database (the check opens no connection; Celery
        # 5.7's Django fixup runs the model checks, which load its backend).
        monkeypatch.setitem(settings.DATABASES, "jobs", {**settings.DATABASES["default"]})
        with override_settings(CELERY_IDEM_DATABASE="jobs"):
            messages = checks.check_tasks()
        assert ids(messages) == ["celery_idem.E003"]
        assert "tests.atomic" in messages[0].msg and "tests.plain" not in messages[0].msg
        assert "SILENCED_SYSTEM_CHECKS" in messages[0].hint
        assert checks.check_tasks() == []  # on "default"


class TestCelerySettings:
    def test_good_settings_pass(self, celery_app):
        assert checks.check_celery_settings() == []

    def test_acks_late_off_is_w001_and_reject_on_worker_lost_off_is_w002(self, celery_app):
        celery_app.conf.task_acks_late = False
        assert ids(checks.check_celery_settings()) == ["celery_idem.W001"]
        celery_app.conf.task_reject_on_worker_lost = False
        assert ids(checks.check_celery_settings()) == ["celery_idem.W001", "celery_idem.W002"]

    def test_kombus_filesystem_transport_is_w006_and_missing_folders_e005(self, celery_app,
                                                                           tmp_path):
        celery_app.conf.broker_url = "filesystem://"
        folders = {name: str(tmp_path / name) for name in
                   ("data_folder_in", "data_folder_out", "processed_folder", "control_folder")}
        celery_app.conf.broker_transport_options = folders
        assert ids(checks.check_celery_settings()) == ["celery_idem.E004", "celery_idem.W006"]
        for path in folders.values():
            os.makedirs(path, exist_ok=True)
        assert ids(checks.check_celery_settings()) == ["celery_idem.W006"]

    def test_celery_idems_filesystem_transport_passes_without_folders(self, celery_app,
                                                                       tmp_path):
        """It creates its folders itself and never loses a half-written message."""
        celery_app.conf.broker_url = "filesystem://"
        celery_app.conf.broker_transport = "celery_idem.filesystem:Transport"
        celery_app.conf.broker_transport_options = {"data_folder_in": str(tmp_path / "x")}
        assert checks.check_celery_settings() == []


class TestLiveness:
    """The worker timeout against the heartbeat, and the recovery schedule against both:
    a dead worker's claims back within 60 s, or a check that says why not."""

    def test_the_default_schedule_and_settings_pass(self, celery_app):
        from celery_idem.beat import recovery_schedule

        celery_app.conf.beat_schedule = recovery_schedule()
        assert checks.check_celery_settings() == []

    @override_settings(CELERY_IDEM_WORKER_HEARTBEAT=10, CELERY_IDEM_WORKER_TIMEOUT=20)
    def test_a_timeout_of_two_heartbeats_is_e040(self, celery_app):
        messages = checks.check_celery_settings()
        assert ids(messages) == ["celery_idem.E040"]
        assert "CELERY_IDEM_WORKER_TIMEOUT (20s)" in messages[0].msg

    def test_passes_as_far_apart_as_the_timeout_are_w040(self, celery_app):
        """Recovery would never watch for a whole timeout: only the lease releases."""
        from celery_idem.beat import recovery_schedule

        celery_app.conf.beat_schedule = {"mine": {**recovery_schedule(35)[
            "celery-idem-recovery"]}}
        messages = checks.check_celery_settings()
        assert ids(messages) == ["celery_idem.W040"] and "every 35s" in messages[0].msg

    def test_a_wait_over_60_s_is_w041_naming_it(self, celery_app):
        from celery.schedules import schedule

        from celery_idem.beat import TASK_NAME

        celery_app.conf.beat_schedule = {"r": {"task": TASK_NAME, "schedule": schedule(20)}}
        with override_settings(CELERY_IDEM_WORKER_TIMEOUT=45):
            messages = checks.check_celery_settings()
        assert ids(messages) == ["celery_idem.W041"] and "65s" in messages[0].msg

    @override_settings(CELERY_IDEM_WORKER_HEARTBEAT=None)
    def test_without_a_heartbeat_nothing_is_checked(self, celery_app):
        celery_app.conf.beat_schedule = {"r": {"task": "celery_idem.release_stale_claims",
                                               "schedule": 3600.0}}
        assert checks.check_celery_settings() == []


class TestPool:
    def test_gevent_with_sqlite_and_eventlet_are_e005(self, celery_app, settings):
        """Seen only when the pool is in the settings (celery worker -P is not)."""
        celery_app.conf.worker_pool = "gevent"
        sqlite = settings.DATABASES["default"]["ENGINE"].endswith("sqlite3")
        assert ids(checks.check_celery_settings()) == (["celery_idem.E005"] if sqlite else [])
        celery_app.conf.worker_pool = "eventlet"
        assert ids(checks.check_celery_settings()) == ["celery_idem.E005"]
        for pool in ("prefork", "threads", "solo"):
            celery_app.conf.worker_pool = pool
            assert checks.check_celery_settings() == []


class TestJobDatabase:
    def test_an_unknown_alias_is_e002_and_a_configuration_error_at_first_use(self):
        """Not Django's ConnectionDoesNotExist at delay(): an error naming the setting."""
        with override_settings(CELERY_IDEM_DATABASE="jobs"):
            messages = checks_settings.check_settings()
            assert checks.check_job_database() == []  # reported once, by E002
            with pytest.raises(ConfigurationError, match="CELERY_IDEM_DATABASE .*'jobs'"):
                ship_order.delay(1)
        assert ids(messages) == ["celery_idem.E002"]
        assert "'jobs'" in messages[0].msg and "CELERY_IDEM_DATABASE" in messages[0].msg

    def test_the_projects_database_passes(self):
        assert checks.check_job_database(databases=["default"]) == []

    def test_sqlite_defaults_are_w003_w004_w005(self):
        """Django's defaults: 5 s busy timeout, rollback journal, deferred transactions."""
        assert ids(checks._check_sqlite("default", {})) == [
            "celery_idem.W003", "celery_idem.W004", "celery_idem.W005"]
        assert ids(checks._check_sqlite("default", {"timeout": 5}))[0] == \
            "celery_idem.W003"
        good = {"timeout": 30, "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode = WAL; PRAGMA synchronous=NORMAL;"}
        assert checks._check_sqlite("default", good) == []


class TestPreparedStatements:
    @staticmethod
    def postgres(**options):
        return {"ENGINE": "django.db.backends.postgresql", "NAME": "jobs", "OPTIONS": options}

    def test_asked_for_where_options_prepare_nothing_is_w007(self):
        """The setting on, and OPTIONS["prepare_threshold"] = None (what PgBouncer users
        were told to set before): psycopg prepares nothing, the setting does nothing."""
        with override_settings(CELERY_IDEM_PREPARED_STATEMENTS=True):
            messages = checks._check_prepared("jobs", self.postgres(prepare_threshold=None))
        assert ids(messages) == ["celery_idem.W007"]
        assert "'jobs'" in messages[0].msg and "PgBouncer" in messages[0].hint

    @pytest.mark.parametrize(("setting", "options"), [
        (True, {}), (True, {"prepare_threshold": 5}), (False, {"prepare_threshold": None}),
        (False, {})])
    def test_agreeing_settings_pass(self, setting, options):
        with override_settings(CELERY_IDEM_PREPARED_STATEMENTS=setting):
            assert checks._check_prepared("jobs", self.postgres(**options)) == []

    def test_the_projects_settings_pass(self):
        assert checks.check_prepared_statements() == []


def test_manage_py_check_passes_on_the_test_project(tmp_path):
    """A fresh process, as ``manage.py check`` runs: the project's task modules are
    imported and every task created, and nothing is reported, not even a warning (on a
    migrated database)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "django_app.settings",
           "PYTHONPATH": str(ROOT), "IDEM_VAR_DIR": str(tmp_path),
           "IDEM_DATABASE": "sqlite"}  # a unit test: whatever database the tier runs
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v0"], cwd=ROOT, env=env,
                   check=True, timeout=120)
    done = subprocess.run(
        [sys.executable, "-m", "django", "check", "--fail-level", "WARNING",
         "--database", "default"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


BROKEN_PROJECT = {
    **project_files("brokenproj"),
    "shop/tasks.py": (
        "from celery import shared_task\nfrom celery_idem import IdempotentTask\n\n"
        "@shared_task(base=IdempotentTask, bind=True)\n"
        "def charge(self, order_id):\n    return order_id\n\n"
        "@shared_task(base=IdempotentTask, bind=True, idempotency_key='ship/{order}')\n"
        "def ship(self, order_id):\n    return order_id\n\n"
        "@shared_task(base=IdempotentTask, bind=True, idempotency_key='ok/{order_id}')\n"
        "def fine(self, order_id):\n    return order_id\n"
    ),
}


def test_manage_py_check_fails_on_a_project_whose_shared_tasks_are_broken(tmp_path):
    """The reported case: ``@shared_task`` classes are created only when the Celery app
    finalizes, so ``manage.py check`` passed and the worker refused to start."""
    done = manage_py_check(tmp_path, BROKEN_PROJECT, "brokenproj")
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if "celery_idem.E001" in line]
    assert len(errors) == 2, done.stderr
    assert any("shop.tasks.charge" in e and "declares no idempotency_key" in e for e in errors)
    assert any("shop.tasks.ship" in e and "'order'" in e for e in errors)
