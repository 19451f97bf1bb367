"""Where a message's durability lives: the job database (an intent per publish) or the
broker (no intent; the worker's claim inserts the row).

``CELERY_IDEM_DURABILITY``:

- ``"database"`` (the default): the producer writes the PENDING intent with the message's
  envelope before the message leaves, so recovery re-sends a message the broker lost,
  ``KeyMismatch`` is raised to the producer, and a publish inside ``transaction.atomic()``
  is an outbox (intent in the transaction, message after the commit, recovery sends it
  if the producer dies between the two).
- ``"broker"``: for a broker that holds the message durably once it has confirmed it
  (RabbitMQ with publisher confirms and durable or quorum queues). The producer computes
  the key and fingerprint and sets the key header, and writes nothing; the worker's
  claim inserts the row (one statement for a fresh key). Given up: a message the broker
  loses is not re-sent, ``KeyMismatch`` is raised at the worker (the message fails), and a
  publish inside ``transaction.atomic()`` leaves after the commit with no row in the
  transaction (Celery's ``delay_on_commit``): a producer that dies between the commit and
  the send loses it. The guarantee table in README.md and docs/explanation/reliability.md says so.

``writes_intent`` is the one rule the producers (``producer``, ``by_name``) ask;
``check`` is the system check of the broker it relies on (W008; run by ``checks``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from django.core import checks

from .check_ids import CHECKS
from .conf import settings
from .errors import ConfigurationError

DATABASE = "database"
BROKER = "broker"
#: kombu transports (URL schemes) that speak AMQP to RabbitMQ: publisher confirms exist.
AMQP_SCHEMES = frozenset({"amqp", "amqps", "pyamqp", "librabbitmq"})


def mode() -> str:
    """The configured durability (``conf`` validates it: ConfigurationError, E007)."""
    return str(settings.DURABILITY)


def writes_intent() -> bool:
    """Whether a publish writes the PENDING intent before its message leaves."""
    return mode() == DATABASE


def check(conf: Any) -> list[checks.CheckMessage]:
    """W008: "broker" on a broker (or settings) that does not hold a confirmed message
    durably. ``conf``: the Celery app's. (An unknown value is E007, ``conf``'s.)"""
    try:
        if writes_intent():
            return []
    except ConfigurationError:
        return []
    problem = broker_problem(conf)
    return [] if problem is None else [
        CHECKS["W008"](f'CELERY_IDEM_DURABILITY is "broker", but {problem}')]


def broker_problem(conf: Any) -> str | None:
    """Why the Celery configuration ``conf`` does not hold a confirmed message durably
    (what "broker" durability relies on), naming what to set; None if it does."""
    scheme = _scheme(conf)
    if scheme not in AMQP_SCHEMES:
        return (f"the broker transport {scheme!r} does not hold messages durably (a "
                "restart or failover can lose a queued message, and nothing re-sends it)")
    options = conf.broker_transport_options or {}
    if not options.get("confirm_publish"):
        return ("RabbitMQ without publisher confirms: a publish returns before the broker "
                "has the message; set CELERY_BROKER_TRANSPORT_OPTIONS = "
                "{'confirm_publish': True}")
    if str(conf.task_default_delivery_mode) in ("transient", "1"):
        return ("task_default_delivery_mode is transient: RabbitMQ keeps such messages in "
                "memory only; set CELERY_TASK_DEFAULT_DELIVERY_MODE = 'persistent'")
    transient = sorted(q.name for q in (conf.task_queues or ())
                       if getattr(q, "durable", True) is False)
    if transient:
        return (f"queues {', '.join(transient)} are not durable: declare them with "
                "durable=True (or as quorum queues)")
    return None


def _scheme(conf: Any) -> str:
    transport = conf.broker_transport
    if isinstance(transport, str) and transport:
        return transport.split(":", 1)[0].lower()
    url = conf.broker_url or "amqp://"
    if isinstance(url, list | tuple):  # failover URLs: the first decides the transport
        url = url[0]
    return (urlparse(str(url).split(";", 1)[0]).scheme or "amqp").lower()
