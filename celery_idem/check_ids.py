"""Every system check id celery-idem reports: one registry, which every check builds its
messages from and the checks reference page is generated from
(``celery_idem.docs_reference``).

A check says what it found in its message (naming the task, the setting, the alias);
the registry holds what the id means in general and its fix, the message's default hint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core import checks

ERROR, WARNING = "error", "warning"
_LEVELS = {ERROR: checks.Error, WARNING: checks.Warning}


@dataclass(frozen=True)
class CheckId:
    """One check id: its level, a title, what it means, and the fix (Markdown)."""

    id: str
    level: str
    title: str
    meaning: str
    fix: str

    def __call__(self, message: str, hint: str | None = None,
                 obj: Any = None) -> checks.CheckMessage:
        """The check message with this id; ``hint`` defaults to the fix."""
        return _LEVELS[self.level](message, hint=hint or _plain(self.fix), obj=obj,
                                   id=self.id)


def _plain(markdown: str) -> str:
    return markdown.replace("`", "")


CHECKS: dict[str, CheckId] = {c.id.removeprefix("celery_idem."): c for c in [
    CheckId("celery_idem.E001", ERROR, "A task's declaration is wrong",
            "An idempotent task cannot be created: no `idempotency_key`, a template naming "
            "a missing parameter, an unknown `idempotency_*` option, a bad "
            "`on_in_progress` / `on_stale_claim` / `max_attempts`. The message names the "
            "task. That task alone is refused: its publishes raise `ConfigurationError`, "
            "its messages fail on the worker without running; every other task works.",
            "Fix the task's declaration."),
    CheckId("celery_idem.E002", ERROR, "The job database alias does not exist",
            "`CELERY_IDEM_DATABASE` is not an alias in `DATABASES`; its first use raises "
            "`ConfigurationError`.",
            "Set `CELERY_IDEM_DATABASE` to one of the aliases in `DATABASES`."),
    CheckId("celery_idem.E003", ERROR, "Atomic tasks off the default database",
            "`atomic=True` tasks while `CELERY_IDEM_DATABASE` is not `\"default\"`: the job "
            "row and the body's writes share one transaction only if the body writes to "
            "the job database; writes to another database are kept when the body fails.",
            "Put the job tables on the body's database; if your `DATABASE_ROUTERS` send "
            "the body's models there, silence it with `SILENCED_SYSTEM_CHECKS = "
            "[\"celery_idem.E003\"]`."),
    CheckId("celery_idem.E004", ERROR, "The filesystem broker's folders are missing",
            "kombu's own `filesystem://` transport with a folder (`data_folder_in`/`out`, "
            "`processed_folder`, `control_folder`) missing.",
            "Create them, or use `CELERY_BROKER_TRANSPORT = "
            "\"celery_idem.filesystem:Transport\"`, which creates them."),
    CheckId("celery_idem.E005", ERROR, "An event-loop pool the database driver blocks",
            "`CELERY_WORKER_POOL` is `eventlet`, or `gevent` with a SQLite job database or "
            "MySQL/MariaDB on mysqlclient: a task waiting for a lock blocks the event loop "
            "while the task holding the lock cannot finish (a pool given with `celery "
            "worker -P` is not seen).",
            "Use gevent with PostgreSQL (or MySQL/MariaDB on PyMySQL), or prefork, solo or "
            "threads."),
    CheckId("celery_idem.E006", ERROR, "celery_idem is not installed",
            "`celery_idem` is imported (e.g. by `recovery_schedule` in your settings) but "
            "not in `INSTALLED_APPS`: no job tables, no publish or worker hooks; `delay()` "
            "would raise `ConfigurationError` naming the same fix.",
            "Add `\"celery_idem\"` to `INSTALLED_APPS`, then run `manage.py migrate`."),
    CheckId("celery_idem.E007", ERROR, "An unknown durability",
            "`CELERY_IDEM_DURABILITY` is neither `\"database\"` nor `\"broker\"` (a publish "
            "would raise `ConfigurationError`).",
            "Use `\"database\"` (the default) or `\"broker\"`."),
    CheckId("celery_idem.E010", ERROR, "MySQL/MariaDB without FOUND_ROWS",
            "A MySQL/MariaDB job database whose `OPTIONS[\"client_flag\"]` lacks "
            "`CLIENT.FOUND_ROWS`: an `UPDATE` counts only changed rows, so a fenced write "
            "that changes nothing reads as a lost claim.",
            "Set `\"client_flag\": CLIENT.FOUND_ROWS | <your flags>`."),
    CheckId("celery_idem.E011", ERROR, "A job table that is not InnoDB",
            "(With `check --database`, and at `migrate`.) A celery_idem table on "
            "MySQL/MariaDB is not InnoDB: no transactions or row locks.",
            "`ALTER TABLE ... ENGINE=InnoDB`; make InnoDB the `default_storage_engine`."),
    CheckId("celery_idem.E012", ERROR, "A setting of the wrong type or range",
            "A `CELERY_IDEM_*` setting is not what it must be (a duration that is not a "
            "number of seconds, a count below its least value, a flag that is not a "
            "bool). The message names the setting; its first use raises "
            "`ConfigurationError` with the same text.",
            "Set it as the settings reference says, or remove it to use the default."),
    CheckId("celery_idem.E013", ERROR, "A serializer other than JSON",
            "`CELERY_TASK_SERIALIZER`, `CELERY_RESULT_SERIALIZER`, `CELERY_ACCEPT_CONTENT` "
            "or `CELERY_RESULT_ACCEPT_CONTENT` names something other than JSON (yaml or "
            "msgpack, say). celery-idem keeps and re-sends messages as JSON, and a worker that "
            "accepts JSON only refuses such a message, which recovery would re-send and "
            "see refused again.",
            "Set `CELERY_TASK_SERIALIZER = CELERY_RESULT_SERIALIZER = \"json\"` and "
            "`CELERY_ACCEPT_CONTENT = [\"json\"]`."),
    CheckId("celery_idem.E014", ERROR, "Prepared statements behind a transaction pooler",
            "`CELERY_IDEM_PREPARED_STATEMENTS` is on while the job database's settings say "
            "its connection goes through a transaction pooler (port 6432, PgBouncer's; "
            "`DISABLE_SERVER_SIDE_CURSORS`, which Django asks for behind one; or a host "
            "named for PgBouncer): a prepared statement is session state, and the pooler "
            "hands the next transaction another session (psycopg's `prepared statement "
            "\"_pg3_0\" already exists`, which celery-idem raises as `ConfigurationError` "
            "naming the setting).",
            "Set `CELERY_IDEM_PREPARED_STATEMENTS = False`; behind PgBouncer 1.21+ with "
            "`max_prepared_statements` silence this check."),
    CheckId("celery_idem.E020", ERROR, "An unknown metrics backend",
            "`CELERY_IDEM_METRICS` names something other than `\"prometheus\"` or "
            "`\"otel\"`.", "Use one of them, a list of them, or None."),
    CheckId("celery_idem.E021", ERROR, "A metrics backend that is not installed",
            "`CELERY_IDEM_METRICS` enables a backend whose library is not installed: "
            "nothing is recorded.",
            "`pip install celery-idem[metrics]` (Prometheus) or `pip install "
            "opentelemetry-api` (OpenTelemetry)."),
    CheckId("celery_idem.E040", ERROR, "A worker timeout too short for its heartbeat",
            "`CELERY_IDEM_WORKER_TIMEOUT` is not more than twice "
            "`CELERY_IDEM_WORKER_HEARTBEAT`: one late beat would make a live worker look "
            "dead, and recovery would hand its claims to another attempt.",
            "Keep the timeout at several heartbeats (the defaults: 5 and 40 seconds)."),
    CheckId("celery_idem.E050", ERROR, "A Django task the worker would not know",
            "A `django.tasks` task of `CeleryIdemBackend` is declared in a module the "
            "worker does not import when it starts (neither an installed app's `tasks` "
            "module nor one of Celery's `imports`/`include`): Celery would discard its "
            "messages as an unregistered task. Its `enqueue()` raises "
            "`ConfigurationError` naming the module; nothing is sent.",
            "Declare the task in its app's `tasks.py`, or add its module to "
            "`CELERY_IMPORTS`."),
    CheckId("celery_idem.E051", ERROR, "The Django tasks backend with broker durability",
            "`TASKS` names `CeleryIdemBackend` while `CELERY_IDEM_DURABILITY` is "
            "`\"broker\"`: a Django task's result is its job, which only a publish with "
            "database durability writes, so every `enqueue()` raises "
            "`ConfigurationError`.",
            "Keep `CELERY_IDEM_DURABILITY = \"database\"` (the default) for a project "
            "that enqueues Django tasks."),
    CheckId("celery_idem.W001", WARNING, "Late acknowledgement is off",
            "`task_acks_late` is off: a worker that dies mid-task has already acknowledged "
            "its message, so only the recovery pass (after the lease) runs the job again.",
            "Set `CELERY_TASK_ACKS_LATE = True`."),
    CheckId("celery_idem.W002", WARNING, "A lost worker's message is not requeued",
            "`task_reject_on_worker_lost` is off: the message of a task whose pool child "
            "was killed is not requeued; the job waits for the recovery pass.",
            "Set `CELERY_TASK_REJECT_ON_WORKER_LOST = True` (with acks_late)."),
    CheckId("celery_idem.W003", WARNING, "SQLite waits too little for a lock",
            "A SQLite job database with a busy timeout under 20 s (Django's default is "
            "5 s): a long atomic task makes other bookkeeping fail with `database is "
            "locked`.", "Set `OPTIONS[\"timeout\"]` to 20 or more (seconds)."),
    CheckId("celery_idem.W004", WARNING, "SQLite not in WAL mode",
            "A SQLite job database not in WAL mode: every write blocks every reader, so "
            "workers and the web process wait on each other.",
            "Set `OPTIONS[\"init_command\"] = \"PRAGMA journal_mode=WAL; PRAGMA "
            "synchronous=NORMAL;\"`."),
    CheckId("celery_idem.W005", WARNING, "SQLite with deferred transactions",
            "A SQLite job database that starts transactions DEFERRED: a transaction that "
            "reads then writes fails at once with `database is locked` instead of waiting.",
            "Set `OPTIONS[\"transaction_mode\"] = \"IMMEDIATE\"`."),
    CheckId("celery_idem.W006", WARNING, "kombu's filesystem transport",
            "The broker is kombu's own `filesystem://` transport, which loses a message "
            "now and then (a consumer can take a file before it is written).",
            "Set `CELERY_BROKER_TRANSPORT = \"celery_idem.filesystem:Transport\"` (it "
            "writes each message atomically and creates its folders)."),
    CheckId("celery_idem.W007", WARNING, "Prepared statements that prepare nothing",
            "`CELERY_IDEM_PREPARED_STATEMENTS` is on, but the job database's "
            "`OPTIONS[\"prepare_threshold\"]` is None, which prepares nothing on that "
            "database: the setting has no effect.",
            "Behind a transaction pooler without prepared-statement support set "
            "`CELERY_IDEM_PREPARED_STATEMENTS = False`; otherwise remove "
            "`prepare_threshold` from `OPTIONS`."),
    CheckId("celery_idem.W008", WARNING, "Broker durability on a broker that can lose "
            "messages",
            "`CELERY_IDEM_DURABILITY = \"broker\"` with a broker or settings that do not "
            "hold a confirmed message durably: a transport other than AMQP (Redis, the "
            "filesystem transport, memory), RabbitMQ without `confirm_publish`, transient "
            "messages (`task_default_delivery_mode`), or a queue in `task_queues` declared "
            "`durable=False`; the message names what to set.",
            "Fix that (RabbitMQ: publisher confirms, persistent messages, durable or "
            "quorum queues), or set `CELERY_IDEM_DURABILITY = \"database\"` so that "
            "recovery can re-send a lost message."),
    CheckId("celery_idem.W009", WARNING, "Optimistic atomic tasks",
            "Tasks declared `atomic=\"optimistic\"`. What they give up against "
            "`atomic=True`: a duplicate that arrives while the first copy runs runs its "
            "body too (no claim to wait on), and its writes roll back; a body that raises "
            "runs a second time under a claim, which records the failure; the body has no "
            "`self.attempt` and no `step`, `heartbeat` or `replace`; the children it sends "
            "have no parent link. Only the database effect is once per key: anything else "
            "the body does (an HTTP call, an email) happens on every run. With "
            "`CELERY_IDEM_DURABILITY = \"database\"` every message has a row already, so "
            "they run as `atomic=True` and gain nothing; the message says which.",
            "Keep it for short bodies whose duplicates are rare and whose only effect is "
            "on the job database, and silence this with `SILENCED_SYSTEM_CHECKS = "
            "[\"celery_idem.W009\"]`; otherwise declare `atomic=True`."),
    CheckId("celery_idem.W040", WARNING, "Recovery passes too far apart for liveness",
            "The recovery entry in `CELERY_BEAT_SCHEDULE` runs passes at least "
            "`CELERY_IDEM_WORKER_TIMEOUT` less one heartbeat apart: recovery never watches "
            "the workers long enough to presume one dead, so a dead worker's claims wait "
            "for their lease.",
            "Run it more often (`recovery_schedule()`: every 10 s), or raise "
            "`CELERY_IDEM_WORKER_TIMEOUT`."),
    CheckId("celery_idem.W041", WARNING, "A dead worker's claims may wait over a minute",
            "`CELERY_IDEM_WORKER_TIMEOUT` plus the interval between recovery passes is "
            "more than 60 s: the longest a dead or frozen worker's claims wait before "
            "another attempt runs.",
            "Run the recovery pass more often (`recovery_schedule()`: every 10 s) or lower "
            "`CELERY_IDEM_WORKER_TIMEOUT`; if the wait is what you want, silence this "
            "with `SILENCED_SYSTEM_CHECKS = [\"celery_idem.W041\"]`."),
    CheckId("celery_idem.W010", WARNING, "MySQL/MariaDB at REPEATABLE READ",
            "A MySQL/MariaDB job database at REPEATABLE READ: a losing claim in a "
            "transaction that already read sees a stale row.",
            "Set `OPTIONS[\"isolation_level\"] = \"read committed\"` (Django's default)."),
    CheckId("celery_idem.W020", WARNING, "A metrics port without Prometheus",
            "`CELERY_IDEM_METRICS_PORT` is set but `CELERY_IDEM_METRICS` does not enable "
            "`\"prometheus\"`: no exporter starts.",
            "Set `CELERY_IDEM_METRICS = \"prometheus\"`, or remove the port."),
]}


def check(code: str) -> CheckId:
    """The registered id ``code`` (``"E001"``); an unknown one is a programming error."""
    return CHECKS[code]
