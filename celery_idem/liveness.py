"""Worker liveness: each worker proves it is alive every few seconds, so recovery hands
back the claims of a worker that stopped (docs/how-to/recovery.md, "A worker that stops: liveness").

A pool child that dies is reported by its MainProcess (``recovery.worker``); nothing
reports the whole worker dying (SIGKILL, an OOM kill of the container, a lost machine) or
freezing (SIGSTOP, a VM paused): without liveness its claims wait for their lease, an
hour for a task without a time limit. So:

- At ``worker_init`` the MainProcess draws a name for this run of the worker,
  ``<hostname>#<random>`` (``worker_name``), before its pool forks: every claim its pool
  makes, in a child or in the MainProcess, names it (``<name>/<pid>``,
  ``claims.worker_id``). A restarted worker, even with the same host name and pids (a
  container), is a new name, so the old run's claims do not look alive.
- From ``worker_ready`` on (after the pool's first forks), a thread of the MainProcess (a
  greenlet under gevent) writes the row of that name every ``CELERY_IDEM_WORKER_HEARTBEAT``
  seconds: one UPDATE per worker and interval, on the thread's own connection (Django's,
  per thread), never on a task's path and with nothing left on the session (it works
  behind a transaction pooler). A thread, not the worker's event loop: the solo pool runs
  bodies in that loop, and a long body is not a dead worker. A prefork child in a long
  body is alive while its MainProcess is; if the child itself dies its MainProcess
  reports it at once, and a child stuck forever is ended by its lease (or time limit).
- A beat that fails (the database down) is logged and tried again next interval; a
  missed beat is not death: recovery, which needs the same database, presumes a worker
  dead only after watching it stay silent for the whole timeout
  (``recovery.liveness``).
- A frozen worker stops beating with everything else in it, so its claims are handed
  back; when it resumes, its commits are refused by the fencing check (the attempt
  number) and it beats again under the same name.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import threading
from typing import Any

from django.db import DatabaseError, connections
from django.utils import timezone

from .conf import settings

logger = logging.getLogger(__name__)

#: This run of the worker: drawn by the MainProcess at worker_init, inherited by the pool
#: processes it forks. None outside a worker, or with the heartbeat off.
_run: str | None = None
#: The heartbeat of this process (MainProcess only). Kept referenced here so that a
#: forked pool child, which inherits the object but not the thread, never lets the
#: thread's connection be collected and closed: that would end the parent's session.
_heartbeat: Heartbeat | None = None


def worker_name(hostname: str | None) -> str:
    """What a claim of this process names its worker by, before ``/<pid>``: the host name,
    and this run of the worker where it beats."""
    name = hostname or "local"
    return f"{name}#{_run}" if _run else name


def node_of(worker: str) -> str:
    """The Celery node a claim's worker names (``host#run/pid`` or ``host/pid``: ``host``)."""
    return worker.split("/", 1)[0].split("#", 1)[0]


class Heartbeat(threading.Thread):
    """Writes the worker's row every ``interval`` seconds until the process ends."""

    def __init__(self, worker: str, hostname: str, alias: str, interval: float) -> None:
        super().__init__(name="celery-idem-heartbeat", daemon=True)
        self.worker, self.hostname, self.alias, self.interval = worker, hostname, alias, interval
        self.stopped = threading.Event()
        self.failing = False
        #: The thread's connection (see ``_heartbeat``).
        self.connection: Any = None

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.beat()
            # Whatever fails, the thread goes on: a worker that stops beating loses its
            # claims while it still runs them.
            except Exception:
                logger.exception("worker %s: heartbeat failed", self.worker,
                                 extra={"action": "heartbeat_failed"})
            self.stopped.wait(self.interval)

    def beat(self) -> bool:
        """Write the row once; False (logged once per outage) if the database failed."""
        from .heartbeat_model import WorkerHeartbeat

        self.connection = connections[self.alias]
        rows = WorkerHeartbeat.objects.using(self.alias)
        try:
            now = timezone.now()
            if not rows.filter(worker=self.worker).update(beat_at=now):
                # The first beat, or recovery deleted the row while this worker was frozen.
                rows.create(worker=self.worker, hostname=self.hostname, pid=os.getpid(),
                            started_at=now, beat_at=now)
        except DatabaseError as exc:
            if not self.failing:
                logger.warning("worker %s could not write its heartbeat: %s", self.worker,
                               exc, extra={"action": "heartbeat_failed"})
            self.failing = True
            return False
        finally:
            # Django's hygiene, as at the end of a request: CONN_MAX_AGE, broken sessions.
            self.connection.close_if_unusable_or_obsolete()
        if self.failing:
            logger.warning("worker %s writes its heartbeat again", self.worker,
                           extra={"action": "heartbeat_resumed"})
            self.failing = False
        return True


def on_worker_init(sender: Any = None, **_: Any) -> None:
    """``worker_init`` receiver (the MainProcess, before its pool forks): name this run,
    unless CELERY_IDEM_WORKER_HEARTBEAT is None."""
    global _run
    if settings.WORKER_HEARTBEAT is not None and _run is None:
        _run = secrets.token_hex(6)


def on_worker_ready(sender: Any = None, **_: Any) -> None:
    """``worker_ready`` receiver (the MainProcess, its pool started): start beating. After
    the pool's first forks, so they copy no thread in the middle of a beat."""
    global _heartbeat
    if _run is None or _heartbeat is not None:
        return
    hostname = getattr(sender, "hostname", None) or "local"
    _heartbeat = Heartbeat(worker_name(hostname), hostname, settings.DATABASE,
                           float(settings.WORKER_HEARTBEAT))
    _heartbeat.start()
    atexit.register(_heartbeat.stopped.set)
