"""The job row per (namespace, key), its append-only transition history, and checkpoints.

The lease behind leader-owned coordinators lives in ``lease_model``, a worker's heartbeat
(worker liveness) in ``heartbeat_model``; both are exported here.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .fields import OrderedJSONField
from .heartbeat_model import WorkerHeartbeat
from .keys import KEY_MAX_LENGTH
from .lease_model import Lease
from .managers import JobQuerySet
from .states import STATE_CHOICES, State


class Job(models.Model):
    """One idempotency key: the intent, the current claim, and the outcome."""

    # Intent: what to run, written by the producer.
    namespace = models.CharField(_("namespace"), max_length=200)
    key = models.CharField(_("key"), max_length=KEY_MAX_LENGTH)
    task_name = models.CharField(_("task name"), max_length=200)
    args = models.JSONField(_("positional arguments"), null=True, blank=True)
    kwargs = models.JSONField(_("keyword arguments"), null=True, blank=True)
    fingerprint = models.CharField(
        _("fingerprint"), max_length=64, help_text=_("SHA-256 of the canonical JSON arguments")
    )
    options = models.JSONField(
        _("delivery options"), default=dict, blank=True,
        help_text=_("queue, priority and routing used to re-dispatch the job"),
    )
    message = models.JSONField(
        _("message"), null=True, blank=True,
        help_text=_("the message as published (headers, body, routing), sent again as is"),
    )
    expires_at = models.DateTimeField(_("expires at"), null=True, blank=True)
    sent_at = models.DateTimeField(
        _("sent at"), null=True, blank=True,
        help_text=_("empty while an intent written in a transaction waits for its message"),
    )

    # The job whose claimed body sent this one (a child key's parent). Forgetting the
    # parent leaves the child and its outcome, unlinked (SET_NULL).
    parent = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="children",
        verbose_name=_("parent job"),
        # Indexed only where set (celery_idem_job_parent_idx): most jobs have no parent.
        db_index=False,
    )

    # Claim: who runs it now, fenced by the attempt number.
    state = models.CharField(
        _("state"), max_length=16, choices=STATE_CHOICES, default=State.PENDING
    )
    attempt = models.PositiveIntegerField(
        _("attempt"), default=0, help_text=_("incremented by every claim; the fencing token")
    )
    worker = models.CharField(_("worker"), max_length=255, blank=True, default="")
    task_id = models.CharField(_("Celery task id"), max_length=255, blank=True, default="")
    lease_expires_at = models.DateTimeField(_("lease expires at"), null=True, blank=True)
    not_before = models.DateTimeField(_("not before"), null=True, blank=True)
    dispatch_count = models.PositiveIntegerField(_("dispatches"), default=0)

    # Outcome.
    # The result as the body returned it, keys in its order (``fields``).
    result = OrderedJSONField(_("result"), null=True, blank=True)
    error = models.JSONField(_("error"), null=True, blank=True)
    # Written by the moves themselves (states.MOVES: set by ``dead_lettered``, cleared by
    # ``reset``), so the jobs given up on are found from the row, not from its history.
    # The database default serves the backends' own INSERT statements.
    dead_lettered = models.BooleanField(
        _("dead-lettered"), default=False, db_default=False, editable=False,
        help_text=_("FAILED because its attempts ran out, or its message could not be "
                    "delivered"),
    )

    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    updated_at = models.DateTimeField(_("updated at"), default=timezone.now)

    objects = JobQuerySet.as_manager()

    class Meta:
        verbose_name = _("idempotent job")
        verbose_name_plural = _("idempotent jobs")
        # Operator actions in the admin, each behind its own permission (docs/how-to/admin.md).
        permissions = [
            ("retry_job", _("Can retry a failed or uncertain job")),
            ("release_job", _("Can release a running job's claim")),
            ("resolve_job", _("Can resolve an uncertain job")),
            ("forget_job", _("Can forget a job so its key can run again")),
        ]
        constraints = [
            # Key first: the same index also serves the admin's search by key prefix
            # (across namespaces) and its ordering by key, so no index of its own on
            # ``key`` is needed. Every non-HOT write of a row (the intent, the claim, the
            # commit) adds an entry to each index: one fewer is ~90 WAL bytes a write.
            models.UniqueConstraint(fields=["key", "namespace"], name="celery_idem_job_key_uniq"),
            models.CheckConstraint(
                condition=models.Q(state__in=[s.value for s in State]),
                name="celery_idem_job_state_valid",
            ),
        ]
        # Only the indexes a query needs, partial where the query names a state: every
        # write that is not a HOT update adds an entry to each index whose condition the
        # new row meets, so a finished job is in none of the state indexes.
        # (MySQL/MariaDB have no partial indexes: they get plain ones, celery_idem/schema.py.)
        indexes = [
            # The reaper and the admin's claim filter: RUNNING past (or within) its lease;
            # the worker's shutdown hand-back (RUNNING by worker).
            models.Index(fields=["lease_expires_at"], name="celery_idem_job_lease_idx",
                         condition=models.Q(state=State.RUNNING.value)),
            # The reaper: PENDING past its dispatch timeout, one range per re-dispatch
            # count (each count waits its own back-off: recovery.due).
            models.Index(fields=["dispatch_count", "updated_at"],
                         name="celery_idem_job_pending_idx",
                         condition=models.Q(state=State.PENDING.value)),
            # The recovery pass: PENDING past its expiry; PENDING never sent (an intent
            # written in a transaction whose message never left). Both few, both read
            # as a range instead of every PENDING job (not on MySQL/MariaDB: schema.py).
            models.Index(fields=["expires_at"], name="celery_idem_job_expiry_idx",
                         condition=models.Q(state=State.PENDING.value,
                                            expires_at__isnull=False)),
            models.Index(fields=["created_at"], name="celery_idem_job_unsent_idx",
                         condition=models.Q(state=State.PENDING.value, sent_at__isnull=True)),
            # The admin's state filter and counts, idem_status: the states that need an
            # operator (SUCCEEDED, the common one, is served by the newest-first scan).
            models.Index(fields=["state", "-created_at"], name="celery_idem_job_attention_idx",
                         condition=models.Q(state__in=[State.FAILED.value, State.UNCERTAIN.value,
                                                       State.EXPIRED.value])),
            # celery_idem.census: the jobs in every state but SUCCEEDED, per task and
            # state, counted from the index alone (SUCCEEDED, the bulk, is estimated).
            models.Index(fields=["state", "task_name"], name="celery_idem_job_census_idx",
                         condition=~models.Q(state=State.SUCCEEDED.value)),
            # The dead-lettered jobs, newest first (the admin's filter, idem_status).
            # (Not on MySQL/MariaDB: there the FAILED jobs' (state, created_at) index serves.)
            models.Index(fields=["-created_at"], name="celery_idem_job_dead_idx",
                         condition=models.Q(state=State.FAILED.value, dead_lettered=True)),
            # The admin: newest first, per task (and the task filter's names), search by
            # task id (by key prefix: the unique index, which leads with the key).
            models.Index(fields=["-created_at"], name="celery_idem_job_created_idx"),
            models.Index(fields=["task_name", "-created_at"], name="celery_idem_job_task_idx"),
            # (On PostgreSQL a hash index, whose entries cost a claim and a commit less
            # WAL: celery_idem/schema.py HASH_INDEXES.)
            models.Index(fields=["task_id"], name="celery_idem_job_task_id_idx"),
            # A job's children (the admin), only the jobs that have a parent.
            models.Index(fields=["parent"], name="celery_idem_job_parent_idx",
                         condition=models.Q(parent__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}:{self.key} [{self.state}]"


class Transition(models.Model):
    """One line of a job's history: a state change, a replayed duplicate, a late finish."""

    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="transitions", verbose_name=_("job"),
        db_index=False,  # celery_idem_transition_job_idx (job, at) serves it
    )
    event = models.CharField(_("event"), max_length=32)
    from_state = models.CharField(
        _("from"), max_length=16, choices=STATE_CHOICES, null=True, blank=True
    )
    to_state = models.CharField(_("to"), max_length=16, choices=STATE_CHOICES)
    attempt = models.PositiveIntegerField(_("attempt"))
    worker = models.CharField(_("worker"), max_length=255, blank=True, default="")
    task_id = models.CharField(_("Celery task id"), max_length=255, blank=True, default="")
    reason = models.TextField(_("reason"), blank=True, default="")
    actor = models.CharField(
        _("actor"), max_length=150, blank=True, default="",
        help_text=_("the user who acted, for operator actions"),
    )
    at = models.DateTimeField(_("at"), default=timezone.now)
    #: Kept by the moves that end an attempt (``states.Move.ends_attempt``): the job row
    #: keeps only its last claim's start.
    attempt_started_at = models.DateTimeField(
        _("attempt started at"), null=True, blank=True,
        help_text=_("when the attempt this move ended had started (a take-over ends the "
                    "attempt before its own)"),
    )

    class Meta:
        verbose_name = _("transition")
        verbose_name_plural = _("transitions")
        ordering = ["at", "id"]
        indexes = [
            models.Index(fields=["job", "at"], name="celery_idem_transition_job_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.from_state or '-'} -> {self.to_state} ({self.event})"


class Checkpoint(models.Model):
    """A step of a job that completed, with its JSON value, so a re-run skips it."""

    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, related_name="checkpoints", verbose_name=_("job"),
        db_index=False,  # the unique (job, step) constraint's index serves it
    )
    step = models.CharField(_("step"), max_length=200)
    value = OrderedJSONField(_("value"), null=True, blank=True)
    attempt = models.PositiveIntegerField(_("attempt"))
    at = models.DateTimeField(_("at"), default=timezone.now)

    class Meta:
        verbose_name = _("checkpoint")
        verbose_name_plural = _("checkpoints")
        constraints = [
            models.UniqueConstraint(fields=["job", "step"], name="celery_idem_checkpoint_uniq")
        ]

    def __str__(self) -> str:
        return f"{self.step} (attempt {self.attempt})"


__all__ = ["Checkpoint", "Job", "Lease", "Transition", "WorkerHeartbeat"]
