"""celery-idem's settings: every ``CELERY_IDEM_<NAME>`` read here, lazily, with its default.

Read on first access (not at import), then kept until Django says a setting changed
(``setting_changed``: ``override_settings`` and pytest-django's ``settings`` fixture send
it), so tests that override a setting see the new value. Kept because the producer and
the worker read several settings per task, and a setting left at its default costs
Django a failed attribute lookup each time.
"""

from __future__ import annotations

from typing import Any

PREFIX = "CELERY_IDEM_"

#: Every setting and its default. Documented in docs/reference/settings.md.
DEFAULTS: dict[str, Any] = {
    # Database alias that holds the job tables.
    "DATABASE": "default",
    # Lease in seconds for a task with no hard time limit (renew with self.heartbeat()).
    "DEFAULT_LEASE": 3600,
    # Seconds added to a task's hard time limit to form its lease.
    "LEASE_GRACE": 60,
    # Seconds between two heartbeats of a worker (its MainProcess writes one row per beat,
    # off the tasks' path); None: no heartbeat, a dead worker's claims wait for their lease.
    "WORKER_HEARTBEAT": 5,
    # Seconds without a heartbeat after which recovery presumes the worker dead and hands
    # its claims back (with the recovery pass every 10 s, within 50 s of its death).
    "WORKER_TIMEOUT": 40,
    # Attempts (claims) per key before the reaper dead-letters it; None for no limit.
    "MAX_ATTEMPTS": 5,
    # Store the arguments in the job row; off keeps only their fingerprint (PII).
    "STORE_ARGUMENTS": True,
    # First and largest delay of a duplicate waiting for a live claim, in seconds.
    "IN_PROGRESS_BACKOFF": 1.0,
    "IN_PROGRESS_MAX_BACKOFF": 30.0,
    # Seconds a PENDING job may wait for its message before the reaper re-dispatches it.
    "DISPATCH_TIMEOUT": 600,
    # Seconds an intent written inside a transaction may stay never sent (its producer
    # died between the commit and the send) before recovery sends its message.
    "NEVER_SENT_TIMEOUT": 30,
    # Re-dispatches of a PENDING job that no worker claims (its task unknown to every
    # worker, its message lost each time) before it ends FAILED ("undeliverable").
    "MAX_REDISPATCHES": 8,
    # Seconds a worker waits (re-queueing with backoff) for the intent of a message that
    # carries a key but whose row does not exist, before it refuses the message.
    "MISSING_INTENT_TIMEOUT": 60,
    # Where a message's durability lives (celery_idem/durability.py): "database" writes
    # an intent per publish (recovery re-sends a lost message); "broker" writes nothing
    # at publish and the worker's claim inserts the row (a broker that holds confirmed
    # messages durably: RabbitMQ with publisher confirms and durable queues).
    "DURABILITY": "database",
    # Rows the reaper takes per batch.
    "REAPER_BATCH_SIZE": 500,
    # Largest wait, in seconds, between two re-dispatches of a PENDING job (the wait
    # starts at DISPATCH_TIMEOUT and doubles with each re-dispatch).
    "DISPATCH_MAX_BACKOFF": 6 * 3600,
    # Workers claim and commit non-atomic tasks on their own PostgreSQL connection,
    # which survives Celery's per-task reconnect (celery_idem/connection.py).
    "DEDICATED_CONNECTION": True,
    # Seconds that connection lives before it is reopened.
    "CONNECTION_MAX_AGE": 600,
    # Whether that connection's claims and commits wait for PostgreSQL's WAL flush (off:
    # set per transaction, never on the session).
    "SYNCHRONOUS_COMMIT": False,
    # Prepare the library's statements on PostgreSQL (session state: not behind a
    # transaction pooler without prepared-statement support; celery_idem/backends/prepared.py).
    "PREPARED_STATEMENTS": False,
    # Django connections in workers: "celery" leaves Celery's fixup (a new connection per
    # task on Celery >= 5.6); "keep" keeps them across tasks and closes them after a task
    # that failed or was interrupted (celery_idem/worker_connections.py).
    "WORKER_CONNECTIONS": "celery",
    # Days a finished job and its history are kept before idem_purge deletes them.
    "RETENTION_DAYS": 30,
    # Metrics (docs/how-to/metrics.md): "prometheus", "otel", both as a list, or None (off).
    "METRICS": None,
    # Port of the Prometheus exporter a worker's main process starts when it is ready
    # (None: none; serve celery_idem.metrics.prometheus.registry() yourself), and its address.
    "METRICS_PORT": None,
    "METRICS_ADDRESS": "0.0.0.0",
    # Seconds the gauges' database readings (jobs per state, oldest stale claim, oldest
    # never-sent intent) are kept between two scrapes.
    "METRICS_CACHE_SECONDS": 30,
    # Distinct task names a process labels metrics with; later ones are labelled "other".
    "METRICS_MAX_TASKS": 200,
}


class Settings:
    """Attribute access to the settings, e.g. ``settings.DEFAULT_LEASE``.

    A value read once is kept as an instance attribute, so the next read is a plain
    attribute hit: ``__getattr__`` runs only on a miss (a read through it, after the
    failed lookup it follows, cost ~5,800 instructions; a library task reads settings
    a dozen times). Django's ``setting_changed`` drops them all."""

    def __init__(self) -> None:
        self._listening = False

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"celery-idem has no setting {PREFIX}{name}")
        from django.conf import settings as django_settings

        if not self._listening:
            from django.core.signals import setting_changed

            setting_changed.connect(self._changed, weak=False,
                                    dispatch_uid="celery_idem.conf.settings")
            self._listening = True
        value = getattr(django_settings, PREFIX + name, DEFAULTS[name])
        self.__dict__[name] = value
        return value

    def _changed(self, **_: Any) -> None:
        # Any setting: cheap, and an override of a setting celery-idem does not read
        # (rare in a hot loop) only costs the next read a lookup.
        for name in DEFAULTS:
            self.__dict__.pop(name, None)


settings = Settings()
