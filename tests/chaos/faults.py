"""The faults: a seeded schedule of kinds and moments, run on a thread of the driver.

Kinds: ``kill_child`` (SIGKILL a busy pool child), ``kill_worker`` (SIGKILL a whole worker,
then start a replacement), ``zombie`` (SIGSTOP a pool child running a non-atomic attempt
until recovery hands its claim to a new attempt, then SIGCONT: its late commit must lose),
``pg_restart`` (``pg_ctl restart -m fast``; behind PgBouncer, PostgreSQL restarted behind
it), ``redis_restart`` (SIGKILL the broker's Redis, which keeps nothing on disk, and start it
again: the queue is gone). Behind PgBouncer (``--database pgbouncer``) also
``pgbouncer_restart`` (its immediate shutdown, every client and server connection dropped,
and a start on the same port) and ``pgbouncer_kill`` (its console's ``KILL`` of the job
database: every connection to it dropped at once, new ones held until ``RESUME`` a second
or three later). Each fault of the database or its pooler lasts until a new client gets an
answer again (``Fault.until``), which the checks use to match repeats to it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.services.mariadb import MariaDB
from tests.services.pgbouncer import PgBouncer

from .fleet import Fleet
from .servers import DATABASE_NAME, Postgres, Redis, wait_for


@dataclass
class Fault:
    kind: str
    at: float                     # time.time() when it struck
    pids: list[int] = field(default_factory=list)  # the processes it hit; empty: all
    detail: dict[str, Any] = field(default_factory=dict)
    #: time.time() when the job database answered a new client again (a fault of the
    #: database or its pooler); None: the fault is a moment.
    until: float | None = None

    @property
    def end(self) -> float:
        return self.at if self.until is None else self.until


#: How often a fault looks for its target (each look waits up to 10 s for a busy child),
#: at its moment in the plan and, if it never struck there, once more after the plan.
TRIES = 3
LATE_TRIES = 12
#: The jobs each fault that strikes a busy pool child may hit (the zombie only those whose
#: late commit is fenced; an atomic one's would roll back with its effect).
BUSY_KINDS = {"kill_child": ("atomic", "charge", "count"), "zombie": ("charge", "count")}
#: Strikes of ``BUSY_KINDS`` one key may take. A key whose every attempt is lost ends
#: dead-lettered after ``CELERY_IDEM_MAX_ATTEMPTS`` (5) as the protocol says, which is
#: not what a run proves: the child faults spread over keys, and two of them on one key
#: leave room for a whole-worker kill and a database restart on it too.
STRIKES_PER_KEY = 2
#: Seconds a zombie stays frozen at most, waiting for its claim's take-over.
ZOMBIE_WAIT = 900


#: SIGKILLs of whole workers among those ``--kills`` asks for (the rest: pool children).
WORKER_KILLS = 1 / 5


def fault_counts(duration: float, redis: bool, pooler: bool = False,
                 at_least: dict[str, int] | None = None) -> dict[str, int]:
    """How many faults of each kind a run of ``duration`` seconds plans: every kind at
    least once, more in longer runs, and at least ``at_least`` of the kinds it names."""
    counts = {"kill_child": max(3, int(duration // 8)), "kill_worker": max(2, int(duration // 25)),
              "zombie": max(1, int(duration // 60)), "pg_restart": max(1, int(duration // 90))}
    if redis:
        counts["redis_restart"] = max(1, int(duration // 90))
    if pooler:
        # Rarer: behind PgBouncer each may keep the database unreachable for 15 s
        # (server_login_retry), and so does every PostgreSQL restart.
        counts["pgbouncer_restart"] = max(1, int(duration // 180))
        counts["pgbouncer_kill"] = max(1, int(duration // 180))
    for kind, n in (at_least or {}).items():
        counts[kind] = max(counts.get(kind, 0), n)
    return counts


def kills(n: int) -> dict[str, int]:
    """At least ``n`` SIGKILLs, as fault counts: one in five of a whole worker."""
    workers = int(n * WORKER_KILLS)
    return {"kill_worker": workers, "kill_child": n - workers}


def schedule(rng: random.Random, duration: float,
             counts: dict[str, int]) -> list[tuple[float, str]]:
    """(seconds after the start, kind), in order: ``counts`` of each kind, at random
    moments between 10% and 90% of the publishing window."""
    plan = [(rng.uniform(0.1, 0.9) * duration, kind)
            for kind, n in counts.items() for _ in range(n)]
    return sorted(plan)


class Injector(threading.Thread):
    """Runs the schedule; ``faults`` is the log of what struck (and ``errors``).

    ``required``: how many of each kind must strike (default: one of each kind planned);
    a kind short of it after the plan strikes again until it is not (``shortfalls``)."""

    def __init__(self, plan: list[tuple[float, str]], rng: random.Random, fleet: Fleet,
                 postgres: Postgres | MariaDB, redis: Redis | None, folder: Path, lease: float,
                 queue: str, canaries: Callable[[], list[tuple[str, list[str]]]],
                 target: Callable[[str], str], pooler: PgBouncer | None = None,
                 required: dict[str, int] | None = None) -> None:
        super().__init__(name="chaos-faults", daemon=True)
        self.plan = plan
        self.required = {kind: 1 for _, kind in plan}
        self.required.update(required or {})
        self.pooler = pooler
        self.rng = rng
        self.fleet = fleet
        self.postgres = postgres
        self.redis = redis
        self.folder = folder
        self.lease = lease
        self.queue = queue
        self.canaries = canaries
        self.target = target
        self.faults: list[Fault] = []
        self.strikes: Counter[str] = Counter()  # per key, of BUSY_KINDS
        self.skipped: list[str] = []
        self.errors: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        for offset, kind in self.plan:
            if self.stopping.wait(max(0.0, start + offset - time.monotonic())):
                return
            self._strike(kind, TRIES)
        # A kind that found no target at enough of its moments (every child idle, e.g.
        # while the workers reconnect after a broker restart and recovery has yet to
        # re-send what they dropped) tries again after the plan: every kind must strike
        # as often as required.
        for kind, short in sorted(self.shortfalls().items()):
            for _ in range(short[1] - short[0]):
                if not self.stopping.is_set():
                    self._strike(kind, LATE_TRIES, late=True)

    def shortfalls(self) -> dict[str, tuple[int, int]]:
        """The kinds that struck fewer times than required: (struck, required)."""
        struck = Counter(fault.kind for fault in self.faults)
        return {kind: (struck[kind], n) for kind, n in self.required.items() if struck[kind] < n}

    def _strike(self, kind: str, tries: int, late: bool = False) -> None:
        try:
            # A fault whose target is not there (no busy child within the pick's wait,
            # on a slow machine) tries again.
            fault = None
            for _ in range(tries):
                if late and kind in BUSY_KINDS and not self._busy(BUSY_KINDS[kind]):
                    # After the plan the publisher may be done and every child idle: the
                    # fault gets a job of its own to strike (a new key, checked as all).
                    self.target(BUSY_KINDS[kind][-1])
                fault = getattr(self, kind)()
                if fault is not None or self.stopping.is_set():
                    break
        except Exception as exc:  # reported and failed by the checks, never hidden
            if self.stopping.is_set():  # the run ended under it (its fleet stopped)
                self.skipped.append(kind)
            else:
                self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
            return
        if fault is None:
            self.skipped.append(kind)
        else:
            self.faults.append(fault)

    # -- targets ---------------------------------------------------------------------

    def _busy(self, kinds: tuple[str, ...]) -> list[tuple[int, dict[str, Any]]]:
        """Pool children running an attempt of one of ``kinds``: (pid, its marker)."""
        busy = []
        for pid in self.fleet.children():
            if not alive(pid):
                continue  # killed, not reaped yet by its worker
            try:
                marker = json.loads(Path(self.folder, "running", str(pid)).read_text())
            except (FileNotFoundError, ValueError):
                continue
            if marker["kind"] in kinds and self.strikes[marker["key"]] < STRIKES_PER_KEY:
                busy.append((pid, marker))
        return busy

    def _pick_busy(self, kinds: tuple[str, ...], timeout: float = 10.0):
        """A random busy child, waiting up to ``timeout`` for one (None: none was busy)."""
        try:
            found = wait_for(lambda: self._busy(kinds), timeout, "a busy pool child", 0.02)
        except TimeoutError:
            return None
        return self.rng.choice(sorted(found, key=lambda b: b[0]))

    def _signal_busy(self, kinds: tuple[str, ...], sig: signal.Signals):
        """Send ``sig`` to a random busy child: (pid, its marker), or None when no child
        was busy or it exited first."""
        picked = self._pick_busy(kinds)
        if picked is None:
            return None
        try:
            os.kill(picked[0], sig)
        except ProcessLookupError:
            return None
        self.strikes[picked[1]["key"]] += 1
        # Until it is dead or stopped: a fault right after must not pick it again (a
        # second SIGKILL of one child would be counted as two).
        wait_for(lambda: not alive(picked[0]), 30, f"pid {picked[0]} to take {sig.name}", 0.01)
        return picked

    # -- the faults --------------------------------------------------------------------

    def kill_child(self) -> Fault | None:
        picked = self._signal_busy(BUSY_KINDS["kill_child"], signal.SIGKILL)
        if picked is None:
            return None
        pid, marker = picked
        return Fault("kill_child", time.time(), [pid], {"key": marker["key"]})

    def kill_worker(self) -> Fault:
        with self.fleet.lock:
            victim = self.rng.choice(self.fleet.workers)
        pids = [victim.pid, *victim.children()]
        victim.kill()
        fault = Fault("kill_worker", time.time(), pids, {"worker": victim.name})
        self.fleet.replace(victim)
        return fault

    def zombie(self) -> Fault | None:
        """Freeze a child past its lease; resume it once its claim was taken over."""
        from celery_idem.models import Job

        picked = self._signal_busy(BUSY_KINDS["zombie"], signal.SIGSTOP)
        if picked is None:
            return None
        pid, marker = picked
        fault = Fault("zombie", time.time(), [pid], dict(marker))
        try:
            def taken_over() -> bool:
                try:
                    return Job.objects.get(key=marker["key"]).attempt > marker["attempt"]
                except Exception:  # PostgreSQL may be restarting: ask again
                    from django.db import connections
                    connections.close_all()
                    return False
            # The take-over needs the re-sent message to reach a worker: behind a backlog
            # that is minutes on a loaded machine, and resuming before it proves nothing.
            wait_for(lambda: taken_over() or self.stopping.is_set(), ZOMBIE_WAIT,
                     f"a take-over of {marker['key']}", 0.2)
            fault.detail["taken_over"] = taken_over()
        except TimeoutError:
            fault.detail["taken_over"] = False
        finally:
            fault.detail["frozen_for"] = round(time.time() - fault.at, 1)
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        return fault

    def pg_restart(self) -> Fault:
        at = time.time()
        self.postgres.restart()
        return self._outage("pg_restart", at, {"down_for": round(time.time() - at, 1)})

    def pgbouncer_restart(self) -> Fault:
        assert self.pooler is not None
        cut = self._pooled()
        at = time.time()
        self.pooler.restart()
        return self._outage("pgbouncer_restart", at,
                            {**cut, "down_for": round(time.time() - at, 1)})

    def pgbouncer_kill(self) -> Fault:
        """KILL the job database on PgBouncer's console, RESUME it a moment later."""
        assert self.pooler is not None
        cut = self._pooled()
        at = time.time()
        self.pooler.admin(f"KILL {DATABASE_NAME}")
        try:
            # How long the database stays unreachable: the fault's own length.
            self.stopping.wait(self.rng.uniform(1, 3))
        finally:
            self.pooler.admin(f"RESUME {DATABASE_NAME}")
        return self._outage("pgbouncer_kill", at,
                            {**cut, "paused_for": round(time.time() - at, 1)})

    def _outage(self, kind: str, at: float, detail: dict[str, Any]) -> Fault:
        """The fault of the job database that struck at ``at``, lasting until a new client
        gets an answer through the workers' path again: behind PgBouncer that may be
        well after PostgreSQL is back or the database resumed, since PgBouncer (1.18)
        opens no server connection for ``server_login_retry`` (15 s) after one failed or
        was killed."""
        from django.db import connection

        def answers() -> bool:
            connection.close()  # this thread's own: a new client, as a worker's would be
            try:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT 1")
            except Exception:
                return False
            return True

        wait_for(answers, 180, f"the job database to answer after {kind}", 0.1)
        until = time.time()
        return Fault(kind, at, [], {**detail, "unreachable_for": round(until - at, 1)}, until)

    def _pooled(self) -> dict[str, int]:
        """What a fault of the pooler is about to cut: the client connections to the job
        database, and the transactions in flight (server sessions linked to a client)."""
        assert self.pooler is not None
        clients = self.pooler.admin("SHOW CLIENTS")
        servers = self.pooler.admin("SHOW SERVERS")
        return {"clients": sum(c["database"] == DATABASE_NAME for c in clients),
                "transactions": sum(s["database"] == DATABASE_NAME and bool(s["link"])
                                    for s in servers)}

    def redis_restart(self) -> Fault:
        import redis as redis_client

        assert self.redis is not None
        client = redis_client.Redis(port=self.redis.port)
        try:  # strike while a backlog waits in the queue (publishing comes in bursts)
            wait_for(lambda: client.llen(self.queue) >= 8, 15, "a backlog", 0.01)
        except TimeoutError:
            pass
        # Keys published now queue behind the backlog (workers take the oldest first),
        # so the crash loses every message of theirs: only a re-send can run them.
        canaries = self.canaries()
        queued = client.lrange(self.queue, 0, -1)
        unacked = client.hlen("unacked")
        at = time.time()
        self.redis.crash()
        client.close()
        self.redis.start()
        text = b"".join(queued)
        whole = [key for key, ids in canaries if all(i.encode() in text for i in ids)]
        return Fault("redis_restart", at, [], {"queued_lost": len(queued),
                                               "unacked_lost": unacked,
                                               "keys_with_every_message_lost": whole})


def alive(pid: int) -> bool:
    """Running or sleeping: not dead and waiting to be reaped (nor stopped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):  # gone (ESRCH: mid-read)
        return False
    return state not in ("Z", "X", "T")
