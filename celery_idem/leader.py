"""``LeaderTask``: a coordinator tick whose body runs only on the holder of its shard's lease.

Beat sends the tick again and again (possibly from several beat instances at once); every
worker that receives it asks for the shard's lease (``celery_idem.leases``). The holder
runs the body and keeps the lease across ticks by acquiring it again, which renews it;
every other worker skips the tick and the skip is recorded. When the holder dies, its
lease expires and the next tick on another worker takes it over with a greater fencing
token, which the body's writes check (``self.check_lease()``) so a holder paused past its
lease cannot overwrite its successor's work.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import threading
from typing import TYPE_CHECKING, Any, ClassVar

from celery import Task

from .errors import ConfigurationError, InvalidLease
from .keys import body_signature, check_template

if TYPE_CHECKING:
    from .lease_model import Lease

logger = logging.getLogger("celery_idem.leader")

#: What a skipped tick logs as ``extra={"action": ...}``.
SKIP_ACTION = "leader_tick_skipped"
#: What a body that ran past its lease logs (at WARNING).
OVERRUN_ACTION = "leader_lease_overrun"

#: The leases this process holds, so that a worker shutting down hands them over at once
#: instead of leaving its shards without a coordinator until the leases expire.
_held: dict[tuple[str, str], Lease] = {}


def release_held(**_: Any) -> None:
    """Release every lease this process holds (on worker and pool-process shutdown)."""
    from . import leases

    for key, lease in list(_held.items()):
        _held.pop(key, None)
        try:
            leases.release(lease)
        except Exception:  # shutting down: the lease expires by itself
            logger.warning("could not release lease %r at shutdown", lease.name, exc_info=True)


def _check_declaration(task_name: str, template: Any, lease: Any,
                       signature: inspect.Signature) -> None:
    """ConfigurationError for a shard template that cannot name a lease, or a lease that
    is not a positive number of seconds."""
    if not isinstance(template, str) or not template.strip():
        raise ConfigurationError(
            f"task {task_name}: LeaderTask needs shard=, a template naming the lease such as "
            f'"tenant/{{tenant_id}}" (a fixed name gives one leader for all ticks)'
        )
    check_template(task_name, template, signature, "shard")
    if isinstance(lease, bool) or not isinstance(lease, int | float) \
            or not math.isfinite(lease) or lease <= 0:
        raise ConfigurationError(
            f"task {task_name}: LeaderTask needs lease=, the seconds a holder keeps the shard "
            f"between ticks (> 0), not {lease!r}"
        )


def holder_id(hostname: str | None) -> str:
    """Who holds a lease: the worker's node name and pid, plus the thread off the main one
    (a threads pool runs several ticks in one process)."""
    holder = f"{hostname or 'local'}/{os.getpid()}"
    if threading.current_thread() is not threading.main_thread():
        holder += f"/{threading.get_ident()}"
    return holder


class LeaderTask(Task):
    """A coordinator tick: the body runs only on the current holder of its shard's lease.

    Task options (``@shared_task(base=LeaderTask, bind=True, ...)``):

    - ``shard``: a format template over the task's parameters naming the lease, e.g.
      ``"tenant/{tenant_id}"``. Tasks with the same shard share one leader.
    - ``lease``: seconds the lease lives; the holder renews it on each tick it runs, so
      make it a few tick intervals, and longer than a body runs (``self.renew_lease()``
      extends it from inside a long body). A worker shutting down releases its leases.

    Inside the body: ``self.lease_name``, ``self.fencing_token`` and
    ``self.check_lease()``, the fencing check a write makes in its transaction.
    A skipped tick returns None, logs ``extra={"action": "leader_tick_skipped"}`` at INFO
    and counts on the lease row (``skipped_ticks``, ``last_skipped_at``; the admin shows
    them).
    """

    shard: ClassVar[str | None] = None
    lease: ClassVar[float | None] = None

    _shard_signature: ClassVar[inspect.Signature | None] = None
    #: Why this task is refused (a bad shard or lease), kept rather than raised: raised at
    #: class creation it would stop the Celery app's finalize, and every other task with
    #: it (as for IdempotentTask: ``declaration``). Check E001 reports it.
    _declaration_error: ClassVar[ConfigurationError | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "run" not in cls.__dict__:
            return  # an abstract base: concrete tasks are checked when they define run
        name = cls.__dict__.get("name") or f"{cls.__module__}.{cls.__qualname__}"
        signature = body_signature(cls.__dict__["run"])
        try:
            _check_declaration(name, cls.shard, cls.lease, signature)
        except ConfigurationError as exc:
            cls._declaration_error = ConfigurationError(
                f"{exc} (the task is refused until its declaration is fixed; manage.py check "
                "reports it as celery_idem.E001)")
            return
        cls._declaration_error = None
        cls._shard_signature = signature

    def _refuse_if_misdeclared(self) -> None:
        if self._declaration_error is not None:
            raise ConfigurationError(str(self._declaration_error))

    def apply_async(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse_if_misdeclared()
        return super().apply_async(*args, **kwargs)

    # -- what the body sees ------------------------------------------------------------

    @property
    def held_lease(self) -> Lease | None:
        """The lease this tick's body runs under (None outside a body)."""
        return getattr(self.request, "_leader_lease", None)

    @property
    def fencing_token(self) -> int | None:
        """The token of this tick's holding: pass it to writes that check it."""
        lease = self.held_lease
        return lease.token if lease else None

    @property
    def lease_name(self) -> str | None:
        lease = self.held_lease
        return lease.name if lease else None

    def check_lease(self, using: str | None = None) -> None:
        """The fencing check for a write inside the body: call it in the write's transaction.

        Raises LeaseLost once another holder has taken the shard.
        """
        from . import leases

        lease = self._require_lease()
        leases.check(lease.name, lease.token, using)

    def renew_lease(self, seconds: float | None = None) -> Lease:
        """Extend the lease from inside a long body; raises LeaseLost if it is gone."""
        from . import leases

        return leases.renew(self._require_lease(), seconds if seconds is not None
                            else self.lease)

    def _require_lease(self) -> Lease:
        lease = self.held_lease
        if lease is None:
            raise ConfigurationError("the lease is only held inside a running tick's body")
        return lease

    def shard_name(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The lease name for one call: the shard template over its arguments."""
        signature = self._shard_signature
        if signature is None:
            raise ConfigurationError(f"{type(self).__name__} defines no task body")
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        try:
            name = str(self.shard).format(**bound.arguments)
        except (KeyError, IndexError, AttributeError) as exc:
            raise InvalidLease(
                f"task {self.name}: shard template {self.shard!r} failed on these "
                f"arguments: {exc!r}"
            ) from exc
        return name

    # -- worker side -------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._refuse_if_misdeclared()  # a message of it fails on the worker, unrun
        request = self.request
        if request.called_directly:
            # A plain function call (a unit test of the body): no lease.
            return super().__call__(*args, **kwargs)
        from . import leases

        name = self.shard_name(args, kwargs)
        holder = holder_id(request.hostname)
        lease = leases.acquire(name, holder, float(self.lease))  # type: ignore[arg-type]
        if lease is None:
            _held.pop((name, holder), None)
            leases.record_skip(name)
            logger.info("%s: tick skipped, another worker holds %r", self.name, name,
                        extra={"action": SKIP_ACTION, "lease": name, "holder": holder,
                               "task": self.name, "task_id": request.id})
            return None
        _held[(name, holder)] = lease
        request._leader_lease = lease
        # The tracer already pushed this request (worker and eager alike): calling run
        # directly keeps it, where Task.__call__ would push a bare one.
        result = self.run(*args, **kwargs)
        if not lease.is_live():
            # Another worker may have run a tick of this shard meanwhile: only the writes
            # that checked the token were safe. The lease is too short for this body.
            logger.warning("%s: the body outlived its lease on %r (%s s)", self.name, name,
                           self.lease, extra={"action": OVERRUN_ACTION, "lease": name,
                                              "holder": holder, "task": self.name})
        return result
