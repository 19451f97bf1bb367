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
        # Strong references (weak=False): the receivers are module-level functions that
        # live as long as the process; each side effect has exactly one trigger.
        from celery import signals

        from . import checks  # noqa: F401 - importing the module registers the checks
        from .connection import on_shutdown, on_task_postrun
        from .leader import release_held
        from .producer import on_before_task_publish
        from .recovery.worker import on_worker_shutdown
        from .runner import note_pool
        from .worker_connections import on_worker_init

        signals.before_task_publish.connect(
            on_before_task_publish, weak=False, dispatch_uid="celery_idem.publish")
        signals.worker_shutdown.connect(
            on_worker_shutdown, weak=False, dispatch_uid="celery_idem.worker_shutdown")
        # The bookkeeping connection a task took goes back to the process's idle ones; a
        # prefork child and the worker process itself (solo, threads, gevent) close theirs.
        signals.task_postrun.connect(
            on_task_postrun, weak=False, dispatch_uid="celery_idem.connection.release")
        signals.worker_process_shutdown.connect(
            on_shutdown, weak=False, dispatch_uid="celery_idem.connection.child_close")
        signals.worker_shutdown.connect(
            on_shutdown, weak=False, dispatch_uid="celery_idem.connection.close")
        # Whether the pool enforces hard time limits, which may then set the lease.
        signals.worker_init.connect(note_pool, weak=False, dispatch_uid="celery_idem.pool")
        # CELERY_IDEM_WORKER_CONNECTIONS, applied after the Django fixup's own worker_init.
        signals.worker_init.connect(
            on_worker_init, weak=False, dispatch_uid="celery_idem.worker_connections")
        # A leader hands its shards over at once when it stops: a prefork child sends
        # worker_process_shutdown; solo and threads pools tick in the main process.
        signals.worker_process_shutdown.connect(
            release_held, weak=False, dispatch_uid="celery_idem.leases_child")
        signals.worker_shutdown.connect(
            release_held, weak=False, dispatch_uid="celery_idem.leases_worker")
