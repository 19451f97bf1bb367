"""celery-idem's settings: every ``CELERY_IDEM_<NAME>`` read and validated here.

``SETTINGS`` is the registry: each setting's default, validator and meaning (the reference
page is generated from it: ``docs_reference``). A value is read on first access, validated
once, and kept until Django says a setting changed (``setting_changed``, which
``override_settings`` sends): the producer and the worker read several settings per task.
A bad value raises ``ConfigurationError`` naming the setting and the fix at its first use;
``manage.py check`` reports every bad one (``checks_settings``: E012, or the setting's id).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .errors import ConfigurationError

PREFIX = "CELERY_IDEM_"
Validator = Callable[[Any], Any]


class Invalid(ValueError):
    """What is wrong with a value (``validate`` names the setting and the fix)."""


@dataclass(frozen=True)
class Setting:
    """One setting: its default, its validator (returns the value to use, or raises
    ``Invalid``), what it means (Markdown, for the reference page), and the system check
    id that reports a bad value."""

    name: str
    default: Any
    validate: Validator
    doc: str
    kind: str
    check: str = "celery_idem.E012"

    @property
    def full_name(self) -> str:
        return PREFIX + self.name


def seconds(minimum: float = 0.0, *, above: bool = False,
            optional: bool = False) -> Validator:
    """A duration in seconds: a number (``3600``) or a ``timedelta``, at least ``minimum``
    (more than it when ``above``); None too when ``optional``."""
    def check(value: Any) -> float | None:
        if value is None and optional:
            return None
        if isinstance(value, timedelta):
            value = value.total_seconds()
        if type(value) not in (int, float) or not math.isfinite(value):
            raise Invalid(f"must be a number of seconds (e.g. 3600) or a timedelta, not "
                          f"{value!r}")
        if value < minimum or (above and value == minimum):
            raise Invalid(f"must be {'more than' if above else 'at least'} {minimum:g} "
                          f"seconds, not {value!r}")
        return value
    return check


def count(minimum: int, *, maximum: int | None = None, optional: bool = False) -> Validator:
    """A whole number from ``minimum`` (to ``maximum``); None too when ``optional``."""
    def check(value: Any) -> int | None:
        if value is None and optional:
            return None
        if type(value) is not int:
            raise Invalid(f"must be a whole number, not {value!r}")
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"at least {minimum}" if maximum is None else f"from {minimum} to {maximum}"
            raise Invalid(f"must be {bound}{' or None' if optional else ''}, not {value!r}")
        return value
    return check


def instance(kind: type, said: str) -> Validator:
    """A non-empty value of type ``kind`` exactly (True is not a number), ``said``."""
    def check(value: Any) -> Any:
        if type(value) is not kind or value == "":
            raise Invalid(f"must be {said}, not {value!r}")
        return value
    return check


flag, text = instance(bool, "True or False"), instance(str, "a non-empty string")


def one_of(*choices: Any) -> Validator:
    """One of ``choices``."""
    def check(value: Any) -> Any:
        if value not in choices:
            raise Invalid(f"must be one of {', '.join(map(repr, choices))}, not {value!r}")
        return value
    return check


def database_alias(value: Any) -> str:
    """An alias in ``DATABASES``."""
    from django.conf import settings as django_settings

    aliases = list(getattr(django_settings, "DATABASES", {}))
    if not isinstance(value, str) or value not in aliases:
        raise Invalid(f"must be an alias in DATABASES ({', '.join(aliases) or 'none'}), "
                      f"not {value!r}")
    return value


METRICS_BACKENDS = ("prometheus", "otel")


def metrics_backends(value: Any) -> Any:
    """None, a backend's name, or a list of them."""
    names = [value] if isinstance(value, str) else value
    if value is not None and (not isinstance(names, list | tuple) or any(
            name not in METRICS_BACKENDS for name in names)):
        raise Invalid(f"must be one of {', '.join(map(repr, METRICS_BACKENDS))}, a list of "
                      f"them, or None, not {value!r}")
    return value


_S = "seconds"
#: Every setting: the registry (docs/reference/settings.md is generated from it).
SETTINGS: dict[str, Setting] = {s.name: s for s in [
    Setting("DATABASE", "default", database_alias, (
        "Database alias of the job tables. `atomic=True` tasks run their body in a "
        "transaction on this alias, so their writes must go there too."),
        "an alias in `DATABASES`", check="celery_idem.E002"),
    Setting("DEFAULT_LEASE", 3600, seconds(0, above=True), (
        "Seconds a claim lives when the task has no hard time limit and no `lease` "
        "option. Renew it with `self.heartbeat()`."), _S),
    Setting("LEASE_GRACE", 60, seconds(0), (
        "Seconds added to a task's hard time limit to form its lease: past the limit "
        "Celery has killed the body, so an older claim is certainly dead."), _S),
    Setting("WORKER_HEARTBEAT", 5, seconds(0, above=True, optional=True), (
        "Seconds between two heartbeats of a worker: its main process writes one row per "
        "beat, on a connection of its own, off the tasks' path. `None`: no heartbeat, and a "
        "dead worker's claims wait for their lease ([liveness]"
        "(../how-to/recovery.md#a-worker-that-stops-liveness))."),
        "seconds, or None"),
    Setting("WORKER_TIMEOUT", 40, seconds(0, above=True), (
        "Seconds without a heartbeat after which recovery presumes a worker dead and hands "
        "its claims back by the hand-back rule, whatever their lease: with the recovery "
        "pass every 10 s (`recovery_schedule()`), within 50 s of the worker's death. Must "
        "be more than two heartbeats (check E040)."), _S),
    Setting("MAX_ATTEMPTS", 5, count(1, optional=True), (
        "Claims of one key before it is dead-lettered (FAILED, reason \"dead-lettered\"); "
        "None for no limit. A task's `max_attempts` option overrides it; without one, a "
        "task with `max_retries=N` gets at least `N + 1`."), "a whole number >= 1, or None"),
    Setting("STORE_ARGUMENTS", True, flag, (
        "Store the arguments in the job row. Off keeps only their fingerprint (for PII), "
        "and the kept message loses its body and argument reprs: such a job cannot be "
        "re-sent by recovery or an operator, only by its producer (a lost message of it "
        "stays PENDING, reported `skipped`)."), "True or False"),
    Setting("IN_PROGRESS_BACKOFF", 1.0, seconds(0, above=True), (
        "First delay, in seconds, of a duplicate waiting for a running attempt "
        "(`on_in_progress=\"retry\"`); it doubles per wait."), _S),
    Setting("IN_PROGRESS_MAX_BACKOFF", 30.0, seconds(0, above=True), "Largest such delay.", _S),
    Setting("DISPATCH_TIMEOUT", 600, seconds(0), (
        "Seconds a PENDING job may wait for its message before recovery re-dispatches "
        "it."), _S),
    Setting("DISPATCH_MAX_BACKOFF", 6 * 3600, seconds(0), (
        "Largest wait, in seconds, between two re-dispatches of a PENDING job (the wait "
        "starts at `DISPATCH_TIMEOUT` and doubles per re-dispatch)."), _S),
    Setting("NEVER_SENT_TIMEOUT", 30, seconds(0), (
        "Seconds an intent may stay *never sent* before recovery sends its message: "
        "written inside `transaction.atomic()` by a producer that died between the commit "
        "and the send, or written outside one by a publish whose broker could not be "
        "reached (the call returned). Distinct from `DISPATCH_TIMEOUT`, which is for "
        "messages that were sent and not claimed."), _S),
    Setting("MAX_REDISPATCHES", 8, count(0), (
        "Re-sends of a PENDING job that no worker claims (no worker has its task "
        "registered, or its message is lost every time) before it ends FAILED with the "
        "reason `Undeliverable`. A job whose stored message cannot be decoded ends so at "
        "its first re-send; a broker that cannot be reached uses up none of them."),
        "a whole number >= 0"),
    Setting("MISSING_INTENT_TIMEOUT", 60, seconds(0), (
        "Seconds a worker waits (re-queueing with backoff) for the intent of a message "
        "that carries a key but whose job row does not exist, before it refuses the "
        "message (`IntentMissing`, logged as `intent_missing`) without running it."), _S),
    Setting("DURABILITY", "database", one_of("database", "broker"), (
        "Where a message's durability lives. `\"database\"`: every publish writes the "
        "job's intent with the message's envelope before the message leaves, so recovery "
        "re-sends a message the broker lost, `KeyMismatch` is raised to the producer, and "
        "a publish inside `transaction.atomic()` is an outbox. `\"broker\"`: for a broker "
        "that holds a confirmed message durably (RabbitMQ with `CELERY_BROKER_TRANSPORT_"
        "OPTIONS = {\"confirm_publish\": True}`, persistent messages, durable or quorum "
        "queues; check W008 warns otherwise): a publish writes nothing (the key goes in "
        "the message), the worker's claim inserts the row. Given up: a message the broker "
        "loses is not re-sent, `KeyMismatch` is raised at the worker, a publish inside "
        "`transaction.atomic()` leaves after the commit with no row in the transaction "
        "(Celery's `delay_on_commit`), a publish whose broker is down raises, a batch is "
        "just publishing, and a job keeps no envelope."), "`\"database\"` or `\"broker\"`",
        check="celery_idem.E007"),
    Setting("REAPER_BATCH_SIZE", 500, count(1), "Rows one recovery batch takes.", "a count"),
    Setting("DEDICATED_CONNECTION", True, flag, (
        "On PostgreSQL, workers claim and commit tasks that are not `atomic` on a "
        "connection of their own (one per running task, with your `DATABASES` settings, "
        "nothing left on its session), which Celery's per-task reconnect does not close; "
        "a producer outside a transaction writes its intent there too. `False` puts all "
        "bookkeeping on Django's connection."), "True or False"),
    Setting("CONNECTION_MAX_AGE", 600, seconds(0), (
        "Seconds that connection lives before it is reopened; it is closed after errors, "
        "as Django does, and never pinged (a dropped one is retried on a fresh "
        "connection)."), _S),
    Setting("SYNCHRONOUS_COMMIT", False, flag, (
        "Whether the claims and commits on that connection wait for PostgreSQL's WAL "
        "flush. Off: each of them sets `synchronous_commit = off` for its own transaction "
        "(nothing left on the session). Off changes no guarantee: a PostgreSQL crash that "
        "loses the last moment of bookkeeping is a crash between the effect and the "
        "commit. Intents, `atomic=True` tasks and your own transactions always keep your "
        "durability."), "True or False"),
    Setting("PREPARED_STATEMENTS", False, flag, (
        "Prepare the library's statements on PostgreSQL (psycopg 3): on Django's "
        "connection from their second use in a session, on the bookkeeping connection "
        "from their first; your own queries are not affected. A prepared statement is "
        "session state: leave it off behind a transaction pooler unless it supports them "
        "(PgBouncer 1.21+ with `max_prepared_statements`); check E014 and a "
        "`ConfigurationError` at run time name it there. The statements of a fresh task "
        "and a replay are stored routines (planned once per server session), so it adds "
        "nothing measurable to them; it prepares the rest (recovery, steps, batches)."),
        "True or False"),
    Setting("WORKER_CONNECTIONS", "celery", one_of("celery", "keep"), (
        "How workers treat Django's database connections between tasks. `\"celery\"` "
        "leaves Celery's Django fixup alone (Celery 5.6+: a new connection for every "
        "task). `\"keep\"` keeps them across tasks, honouring `CONN_MAX_AGE`, and closes "
        "them after any task that did not succeed or left the driver mid-query."),
        "`\"celery\"` or `\"keep\"`"),
    Setting("RETENTION_DAYS", 30, seconds(0, above=True), (
        "Days a finished job and its history are kept before `idem_purge` deletes "
        "them."), "days (a number)"),
    Setting("METRICS", None, metrics_backends, (
        "Metrics backends: `\"prometheus\"` (the `metrics` extra), `\"otel\"` "
        "(`opentelemetry-api`), a list of both, or `None` (off)."),
        "`\"prometheus\"`, `\"otel\"`, a list of them, or None", check="celery_idem.E020"),
    Setting("METRICS_PORT", None, count(1, maximum=65535, optional=True), (
        "Port of the Prometheus exporter a worker's main process starts once its pool is "
        "up (prefork needs `PROMETHEUS_MULTIPROC_DIR`); `None` starts none."),
        "a port (1-65535), or None"),
    Setting("METRICS_ADDRESS", "0.0.0.0", text, "Address that exporter listens on.", "a host"),
    Setting("METRICS_CACHE_SECONDS", 30, seconds(0), (
        "Seconds a reading of the gauges from the database is kept between scrapes."), _S),
    Setting("METRICS_MAX_TASKS", 200, count(1), (
        "Distinct task names a process labels metrics with; later ones are labelled "
        "`other` (bounded series)."), "a whole number >= 1"),
]}

#: Every setting's default.
DEFAULTS: dict[str, Any] = {name: s.default for name, s in SETTINGS.items()}


def validate(name: str, value: Any) -> Any:
    """``value`` of setting ``name`` as it is used; ConfigurationError naming the setting
    and the fix when it is not valid."""
    setting = SETTINGS[name]
    try:
        return setting.validate(value)
    except Invalid as exc:
        raise ConfigurationError(
            f"{setting.full_name} {exc}: set it to {setting.kind} (default "
            f"{setting.default!r}), or remove it") from None


def problems() -> list[tuple[Setting, str]]:
    """Every setting whose value is not valid, with its error (``manage.py check``)."""
    from django.conf import settings as django_settings

    found = []
    for name, setting in SETTINGS.items():
        try:
            validate(name, getattr(django_settings, setting.full_name, setting.default))
        except ConfigurationError as exc:
            found.append((setting, str(exc)))
    return found


class Settings:
    """Attribute access to the settings, e.g. ``settings.DEFAULT_LEASE``.

    A value read once is validated and kept as an instance attribute, so the next read is
    a plain attribute hit: ``__getattr__`` runs only on a miss (a read through it, after
    the failed lookup it follows, cost ~5,800 instructions; a library task reads settings
    a dozen times). Django's ``setting_changed`` drops them all."""

    def __init__(self) -> None:
        self._listening = False

    def __getattr__(self, name: str) -> Any:
        if name not in SETTINGS:
            raise AttributeError(f"celery-idem has no setting {PREFIX}{name}")
        from django.conf import settings as django_settings

        if not self._listening:
            from django.core.signals import setting_changed

            setting_changed.connect(self._changed, weak=False,
                                    dispatch_uid="celery_idem.conf.settings")
            self._listening = True
        value = validate(name, getattr(django_settings, PREFIX + name, DEFAULTS[name]))
        self.__dict__[name] = value
        return value

    def _changed(self, **_: Any) -> None:
        # Any setting: cheap, and an override of a setting celery-idem does not read
        # (rare in a hot loop) only costs the next read a lookup.
        for name in SETTINGS:
            self.__dict__.pop(name, None)


settings = Settings()
