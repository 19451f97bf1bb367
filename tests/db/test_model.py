"""A model-based test: Hypothesis drives simulated workers, recovery passes and operators
through random interleavings against the real job store, and checks a plain Python
model of every key (and the protocol's invariants) against the database after each step.

The workers are simulated in this process: each claim is the library's own
``claims.acquire`` under a worker name and task id of its own, and its outcome the
won ``Claim``'s fenced commits; recovery is the real ``sweep.reap``; operators call
``celery_idem.actions``. Messages are a list in the model (what a broker would hold):
publishing, a scheduled retry, a redelivery, a re-send by recovery or by an operator
adds one; a worker takes one that is due. Time is moved with freezegun (no live worker
runs here). ``IDEM_MODEL_EXAMPLES`` / ``IDEM_MODEL_STEPS`` run it larger.

The model (its rows, tasks and messages) is tests/db/model_rows.py, the rules that
drive it tests/db/model_rules.py; this module holds the invariants checked after
every step, and the test.
"""

from __future__ import annotations

import os

import pytest
from django.test import override_settings
from freezegun import freeze_time
from hypothesis import settings as hsettings
from hypothesis.stateful import invariant, run_state_machine_as_test

from celery_idem import actions
from celery_idem.connection import close_bookkeeping_connections
from celery_idem.history import path_errors
from celery_idem.models import Job, Transition
from celery_idem.recovery import sweep
from tests.db.model_rows import (
    DISPATCH_TIMEOUT,
    MAX_BACKOFF,
    MAX_REDISPATCHES,
    SEEN,
    T0,
    F,
    R,
    S,
    Sent,
)
from tests.db.model_rules import ModelRules

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = int(os.environ.get("IDEM_MODEL_EXAMPLES", "40"))
STEPS = int(os.environ.get("IDEM_MODEL_STEPS", "60"))


class Model(ModelRules):
    """The machine: the rules (tests/db/model_rules.py) and the invariants checked
    after every step."""

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def the_database_is_the_model(self) -> None:
        jobs = {(j.namespace, j.key): j for j in Job.objects.all()}
        assert set(jobs) == set(self.rows)
        for key, row in self.rows.items():
            job = jobs[key]
            got = (job.pk, job.state, job.attempt, job.task_id, job.lease_expires_at,
                   job.not_before, job.dispatch_count, job.args)
            assert got == (row.job_id, row.state, row.attempt, row.task_id, row.lease,
                           row.not_before, row.dispatch_count, [row.k, row.v]), key
            if row.state in (S, F):
                assert job.result == row.result

    @invariant()
    def succeeded_never_changes(self) -> None:
        """Once a key SUCCEEDED, its state, result and attempt stay (until forgotten)."""
        for job in Job.objects.filter(state=S):
            self.succeeded.setdefault(job.pk, (job.result, job.attempt))
            if job.result is not None:  # None: an operator resolved an UNCERTAIN job
                assert job.result["attempt"] == job.attempt, "written by a stale attempt"
        live = {job.pk: job for job in Job.objects.filter(pk__in=self.succeeded)}
        for pk, (result, attempt) in self.succeeded.items():
            job = live[pk]
            assert (job.state, job.result, job.attempt) == (S, result, attempt)

    @invariant()
    def at_most_one_live_claim_per_key(self) -> None:
        """A RUNNING row within its lease is held by exactly one won, unfinished claim."""
        now = self.now()
        for row in self.rows.values():
            holders = [a for a in self.attempts if a.row is row and self.owns(a)]
            assert len(holders) <= 1
            if row.state is R and row.lease is not None and row.lease >= now:
                assert len(holders) == 1 and holders[0].claim.attempt == row.attempt

    @invariant()
    def every_history_is_a_path(self) -> None:
        lines: dict[int, list[tuple[str, str | None, str]]] = {}
        for job_id, *line in Transition.objects.order_by("id").values_list(
                "job_id", "event", "from_state", "to_state"):
            lines.setdefault(job_id, []).append(tuple(line))  # type: ignore[arg-type]
        for job in Job.objects.all():
            errors = path_errors(lines.get(job.pk, []), job.state)
            assert not errors, (job.key, errors, lines.get(job.pk))


@pytest.fixture
def machine(backend, monkeypatch):
    """The machine class bound to a frozen clock and a fake broker for re-sends."""
    sent = Sent()
    monkeypatch.setattr(sweep, "redispatch", sent)
    monkeypatch.setattr(actions, "redispatch", sent)
    with override_settings(CELERY_IDEM_DISPATCH_TIMEOUT=DISPATCH_TIMEOUT,
                           CELERY_IDEM_DISPATCH_MAX_BACKOFF=MAX_BACKOFF,
                           CELERY_IDEM_MAX_REDISPATCHES=MAX_REDISPATCHES), \
            freeze_time(T0, ignore=["hypothesis"]) as clock:
        Model.clock, Model.sent = clock, sent
        yield Model
    close_bookkeeping_connections()  # the test database is dropped at the end


def test_random_interleavings_keep_the_protocol(machine):
    SEEN.clear()
    run_state_machine_as_test(machine, settings=hsettings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None))
    print("\nmodel test exercised:", ", ".join(f"{k}: {n}" for k, n in sorted(SEEN.items())))
