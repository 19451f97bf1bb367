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
