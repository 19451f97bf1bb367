"""The Django app: connects the Celery hooks once Django is ready."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class CeleryIdemConfig(AppConfig):
    name = "celery_idem"
    label = "celery_idem"
    verbose_name = _("Idempotent tasks")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from celery import current_app, signals

        from . import checks, checks_mysql, checks_settings  # noqa: F401 - registers checks
        from .by_name import install, on_before_task_publish
        from .connection import on_shutdown, on_task_postrun
        from .leader import release_held
        from .liveness import on_worker_init as name_run
        from .liveness import on_worker_ready as start_heartbeat
        from .metrics import checks as metrics_checks  # noqa: F401
        from .metrics import install as install_metrics
        from .pools import note_pool
        from .recovery.worker import on_worker_shutdown
        from .worker_connections import on_worker_init

        # Metrics connect their receivers (and a worker's exporter) only when
        # CELERY_IDEM_METRICS enables them: celery_idem.metrics.install.
        install_metrics()

        # Every other Celery signal celery-idem listens to, in one place: (signal, receiver,
        # what for). A prefork child sends worker_process_shutdown; the worker process
        # itself (and solo, threads and gevent pools, which run tasks in it)
        # worker_shutdown.
        receivers = [
            (signals.before_task_publish, on_before_task_publish,
             "publish"),  # a send_task message of a known task gets its intent
            (signals.worker_init, note_pool,
             "pool"),  # whether the pool enforces hard time limits (the lease)
            (signals.worker_init, on_worker_init,
             "worker_connections"),  # CELERY_IDEM_WORKER_CONNECTIONS, after the fixup's
            (signals.worker_init, name_run,
             "liveness.run"),  # the name its claims carry (before its pool forks)
            (signals.worker_ready, start_heartbeat,
             "liveness.heartbeat"),  # the worker proves it is alive from now on
            (signals.task_postrun, on_task_postrun,
             "connection.release"),  # the task's bookkeeping connection goes back
            (signals.worker_process_shutdown, on_shutdown, "connection.child_close"),
            (signals.worker_shutdown, on_shutdown, "connection.close"),
            (signals.worker_shutdown, on_worker_shutdown,
             "worker_shutdown"),  # claims still held by the pool are handed back
            (signals.worker_process_shutdown, release_held,
             "leases_child"),  # a leader hands its shards over at once
            (signals.worker_shutdown, release_held, "leases_worker"),
        ]
        # Strong references (weak=False): the receivers are module-level functions that
        # live as long as the process; a dispatch_uid each, so each connects once.
        for signal, receiver, uid in receivers:
            signal.connect(receiver, weak=False, dispatch_uid=f"celery_idem.{uid}")
        # app.send_task takes idempotency_key= and refuses a PER_CALL task without one
        # at the call (celery_idem.by_name); the project's app is current by now.
        install(current_app)
