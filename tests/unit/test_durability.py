"""``celery_idem.durability``: the one rule the producers ask, and its system checks
(E007 an unknown value, W008 "broker" on a broker that does not hold messages durably)."""

from __future__ import annotations

import pytest
from kombu import Queue

from celery_idem import checks, checks_settings, durability
from celery_idem.errors import ConfigurationError
from tests.unit.test_checks import celery_app, ids  # noqa: F401 (the fixture)

RABBITMQ = "amqp://guest:guest@127.0.0.1:5672//"


def test_the_default_writes_the_intent(settings):
    assert durability.writes_intent() is True
    settings.CELERY_IDEM_DURABILITY = "broker"
    assert durability.writes_intent() is False


def test_an_unknown_value_is_a_configuration_error_and_e007(settings, celery_app):  # noqa: F811
    settings.CELERY_IDEM_DURABILITY = "rabbit"
    with pytest.raises(ConfigurationError, match="CELERY_IDEM_DURABILITY must be one of"):
        durability.writes_intent()
    assert ids(checks_settings.check_settings()) == ["celery_idem.E007"]
    assert checks.check_celery_settings() == []  # reported once


@pytest.mark.parametrize(("url", "transport", "options", "named"), [
    ("redis://127.0.0.1:6379/0", None, {}, "'redis'"),
    ("filesystem://", "celery_idem.filesystem:Transport", {}, "'celery_idem.filesystem'"),
    ("memory://", None, {}, "'memory'"),
    (RABBITMQ, None, {}, "{'confirm_publish': True}"),
    (RABBITMQ, None, {"confirm_publish": False}, "{'confirm_publish': True}"),
], ids=["redis", "filesystem", "memory", "rabbitmq-no-confirms", "rabbitmq-confirms-off"])
def test_broker_durability_on_a_broker_that_can_lose_a_message_is_w008(
        settings, celery_app, url, transport, options, named):  # noqa: F811
    """The warning names what to set."""
    settings.CELERY_IDEM_DURABILITY = "broker"
    celery_app.conf.broker_url = url
    celery_app.conf.broker_transport = transport
    celery_app.conf.broker_transport_options = options
    messages = [m for m in checks.check_celery_settings() if m.id == "celery_idem.W008"]
    assert len(messages) == 1
    assert named in messages[0].msg
    assert 'CELERY_IDEM_DURABILITY = "database"' in messages[0].hint


def test_rabbitmq_with_confirms_passes_unless_messages_or_queues_are_transient(
        settings, celery_app):  # noqa: F811
    settings.CELERY_IDEM_DURABILITY = "broker"
    settings.TASKS = {}  # Django 6's tasks backend needs database durability (E051)
    celery_app.conf.broker_url = RABBITMQ
    celery_app.conf.broker_transport_options = {"confirm_publish": True}
    assert checks.check_celery_settings() == []
    celery_app.conf.task_default_delivery_mode = "transient"
    (message,) = checks.check_celery_settings()
    assert message.id == "celery_idem.W008" and "'persistent'" in message.msg
    celery_app.conf.task_default_delivery_mode = "persistent"
    celery_app.conf.task_queues = [Queue("fast", durable=False), Queue("slow")]
    (message,) = checks.check_celery_settings()
    assert message.id == "celery_idem.W008" and "fast are not durable" in message.msg


def test_the_default_durability_checks_nothing_about_the_broker(settings, celery_app):  # noqa: F811
    celery_app.conf.broker_url = "redis://127.0.0.1:6379/0"
    assert checks.check_celery_settings() == []
