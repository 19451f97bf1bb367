"""celery_idem.conf: settings are kept after the first read, and an override is seen."""

from __future__ import annotations

import pytest
from django.test import override_settings

from celery_idem.conf import DEFAULTS, settings


def test_a_setting_left_unset_reads_as_its_default():
    assert settings.REAPER_BATCH_SIZE == DEFAULTS["REAPER_BATCH_SIZE"]


def test_override_settings_is_seen_inside_and_undone_after():
    """The kept value is dropped when Django announces a change (setting_changed)."""
    before = settings.MAX_ATTEMPTS
    with override_settings(CELERY_IDEM_MAX_ATTEMPTS=before + 7):
        assert settings.MAX_ATTEMPTS == before + 7
    assert settings.MAX_ATTEMPTS == before


def test_the_settings_fixture_is_seen(settings_fixture_value):
    assert settings.LEASE_GRACE == settings_fixture_value


@pytest.fixture
def settings_fixture_value(settings):
    """pytest-django's ``settings`` fixture (an override_settings underneath)."""
    assert globals()["settings"].LEASE_GRACE == DEFAULTS["LEASE_GRACE"]  # read and kept
    settings.CELERY_IDEM_LEASE_GRACE = 123
    return 123


def test_an_unknown_setting_is_an_attribute_error():
    with pytest.raises(AttributeError, match="CELERY_IDEM_NO_SUCH"):
        settings.NO_SUCH  # noqa: B018


@pytest.mark.parametrize(("name", "value", "said"), [
    ("DEFAULT_LEASE", "1h", "must be a number of seconds"),
    ("DEFAULT_LEASE", 0, "must be more than 0 seconds"),
    ("LEASE_GRACE", -1, "must be at least 0 seconds"),
    ("DISPATCH_TIMEOUT", float("nan"), "must be a number of seconds"),
    ("MAX_ATTEMPTS", -1, "must be at least 1 or None"),
    ("MAX_ATTEMPTS", 2.5, "must be a whole number"),
    ("REAPER_BATCH_SIZE", True, "must be a whole number"),
    ("STORE_ARGUMENTS", "yes", "must be True or False"),
    ("METRICS_PORT", 70000, "must be from 1 to 65535 or None"),
    ("WORKER_CONNECTIONS", "always", "must be one of 'celery', 'keep'"),
    ("METRICS", ["prometheus", "statsd"], "must be one of 'prometheus', 'otel'"),
])
def test_a_bad_value_is_a_configuration_error_at_first_use_and_at_check(name, value, said):
    """Each names the setting and the fix, at the first read (not a bare ValueError deep
    in a worker) and in manage.py check, under the setting's check id."""
    from celery_idem.checks_settings import check_settings
    from celery_idem.conf import SETTINGS
    from celery_idem.errors import ConfigurationError

    with override_settings(**{f"CELERY_IDEM_{name}": value}):
        with pytest.raises(ConfigurationError, match=f"CELERY_IDEM_{name} {said}") as raised:
            getattr(settings, name)
        assert "set it to" in str(raised.value)
        (message,) = check_settings()
    assert message.id == SETTINGS[name].check and f"CELERY_IDEM_{name}" in message.msg


def test_a_duration_may_be_a_timedelta_and_is_read_as_seconds():
    from datetime import timedelta

    with override_settings(CELERY_IDEM_DEFAULT_LEASE=timedelta(hours=1)):
        assert settings.DEFAULT_LEASE == 3600.0


def test_every_default_is_valid_and_documented():
    from celery_idem.conf import SETTINGS, validate

    for name, setting in SETTINGS.items():
        assert validate(name, setting.default) == setting.default
        assert setting.doc.strip() and setting.kind.strip()


def test_a_task_without_a_time_limit_reads_a_bad_lease_as_a_configuration_error():
    """CELERY_IDEM_DEFAULT_LEASE = "1h": the worker's lease raises the setting's error."""
    from celery_idem.errors import ConfigurationError
    from django_app.effects.tasks import ship_order

    with override_settings(CELERY_IDEM_DEFAULT_LEASE="1h"), \
            pytest.raises(ConfigurationError, match="CELERY_IDEM_DEFAULT_LEASE"):
        ship_order.lease_seconds()
