"""The worker connection policy's wiring, in process (the behaviour is tested on real
workers in tests/integration/test_worker_connections.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from celery import Celery, signals
from celery.fixups.django import DjangoFixup
from django.test import override_settings

from celery_idem import worker_connections as wc
from celery_idem.errors import ConfigurationError


@pytest.fixture
def fixup_app():
    """An app whose Django fixup has installed its per-task close, cleaned up after."""
    app = Celery("wc-test", set_as_current=False)
    fixup = DjangoFixup(app)
    worker_fixup = fixup.worker_fixup
    signals.task_prerun.connect(worker_fixup.on_task_prerun)
    signals.task_postrun.connect(worker_fixup.on_task_postrun)
    app._fixups = [fixup]
    yield app, worker_fixup
    signals.task_prerun.disconnect(worker_fixup.on_task_prerun)
    signals.task_postrun.disconnect(worker_fixup.on_task_postrun)
    signals.task_prerun.disconnect(dispatch_uid=f"{wc._UID}.prerun")
    signals.task_postrun.disconnect(dispatch_uid=f"{wc._UID}.postrun")
    signals.worker_process_init.disconnect(dispatch_uid=f"{wc._UID}.child")
    signals.worker_init.disconnect(dispatch_uid=f"{wc._UID}.install")


def _has(signal, receiver) -> bool:
    return receiver in signal._live_receivers(None)


@override_settings(CELERY_IDEM_WORKER_CONNECTIONS="keep")
def test_setting_keep_swaps_the_fixup_close_for_the_policy(fixup_app):
    app, worker_fixup = fixup_app
    assert _has(signals.task_prerun, worker_fixup.on_task_prerun)
    wc.on_worker_init(sender=SimpleNamespace(app=app))
    assert not _has(signals.task_prerun, worker_fixup.on_task_prerun)
    assert not _has(signals.task_postrun, worker_fixup.on_task_postrun)
    assert _has(signals.task_prerun, wc.before_task)
    assert _has(signals.task_postrun, wc.after_task)


@override_settings(CELERY_IDEM_WORKER_CONNECTIONS="celery")
def test_default_leaves_celery_alone(fixup_app):
    app, worker_fixup = fixup_app
    wc.on_worker_init(sender=SimpleNamespace(app=app))
    assert _has(signals.task_prerun, worker_fixup.on_task_prerun)
    assert not _has(signals.task_prerun, wc.before_task)


class FakeWorker:
    def __init__(self, app: Celery) -> None:
        self.app = app


def test_install_applies_to_its_own_app_only(fixup_app):
    app, worker_fixup = fixup_app
    wc.install(app)
    signals.worker_init.send(sender=FakeWorker(Celery("other", set_as_current=False)))
    assert _has(signals.task_prerun, worker_fixup.on_task_prerun)
    signals.worker_init.send(sender=FakeWorker(app))
    assert not _has(signals.task_prerun, worker_fixup.on_task_prerun)
    assert _has(signals.task_prerun, wc.before_task)


@override_settings(CELERY_IDEM_WORKER_CONNECTIONS="always")
def test_an_unknown_policy_fails_the_worker_start():
    with pytest.raises(ConfigurationError, match="WORKER_CONNECTIONS"):
        wc.on_worker_init(sender=SimpleNamespace(app=None))


def test_keep_warns_without_conn_max_age_only(fixup_app, caplog, monkeypatch):
    from django.conf import settings

    monkeypatch.setitem(settings.DATABASES["default"], "CONN_MAX_AGE", 300)
    wc.take_over(fixup_app[0])
    assert "CONN_MAX_AGE" not in caplog.text
    monkeypatch.setitem(settings.DATABASES["default"], "CONN_MAX_AGE", 0)
    wc.take_over(fixup_app[0])
    assert "CONN_MAX_AGE" in caplog.text
