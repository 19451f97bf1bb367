"""The rules of the model test (tests/db/test_model.py): what producers, simulated
workers, time, the recovery pass and operators do to the job store, each checked against
what the model (tests/db/model_rows.py) says it must do."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from celery_idem import actions, claims
from celery_idem.errors import ClaimLost, KeyMismatch
from celery_idem.models import Job
from celery_idem.producer import inserted_id, write_intent
from celery_idem.recovery import sweep
from celery_idem.states import MOVES, State
from tests.db.model_rows import (
    DISPATCH_TIMEOUT,
    KEYS,
    LEASE,
    MAX_ATTEMPTS,
    MAX_BACKOFF,
    MAX_REDISPATCHES,
    SEEN,
    TASKS,
    WORKERS,
    Attempt,
    F,
    Message,
    ModelState,
    P,
    R,
    Row,
    S,
    key_of,
)


class ModelRules(ModelState):
    """The rules, on the model's state; test_model.Model adds the invariants."""

    # -- producers -----------------------------------------------------------------------

    @rule(task=st.sampled_from(sorted(TASKS)), k=st.sampled_from(KEYS), v=st.integers(0, 1))
    def publish(self, task: str, k: int, v: int) -> None:
        """Publish (a duplicate when the key exists; other arguments when v differs)."""
        intent = TASKS[task].intent((k, v))
        task_id = str(uuid.uuid4())
        row = self.rows.get((intent.namespace, intent.key))
        if row is not None and row.v != v:
            with pytest.raises(KeyMismatch):
                write_intent(intent, task_id)
            return
        job_id = inserted_id(write_intent(intent, task_id))
        if row is None:
            assert job_id is not None
            self.rows[(intent.namespace, intent.key)] = Row(
                job_id, task, k, v, task_id=task_id, updated=self.now())
        else:
            assert job_id is None
        self.messages.append(Message(task, k, v, task_id))

    # -- workers -------------------------------------------------------------------------

    @precondition(lambda self: self.messages)
    @rule(pick=st.integers(0, 99), worker=st.sampled_from(WORKERS), keep=st.booleans())
    def deliver(self, pick: int, worker: str, keep: bool) -> None:
        """A worker takes a due message and claims its key (``keep``: the broker keeps a
        copy, as a redelivery would)."""
        # Real time passes between two deliveries: a claim tells its own earlier try
        # (lost with its connection) by the lease it wrote (claims._ours), which the same
        # message delivered again within one tick of a frozen clock would repeat.
        self.clock.tick(timedelta(microseconds=1))
        now = self.now()
        due = [m for m in self.messages if m.eta is None or m.eta <= now]
        if not due:
            return
        msg = due[pick % len(due)]
        if not keep:
            self.messages.remove(msg)
        intent = TASKS[msg.task].intent((msg.k, msg.v))
        row = self.rows.get((intent.namespace, intent.key))
        expect = row is not None and row.v == msg.v and (
            row.not_before is None or row.not_before <= now or row.task_id == msg.task_id
        ) and (row.state is P or (row.state is R and row.lease is not None and row.lease < now))
        outcome, claim = claims.acquire(intent, worker=worker, task_id=msg.task_id,
                                        lease_seconds=LEASE, using="default", dedicated=True,
                                        insert_missing=False)
        assert (claim is not None) is expect, (row, msg, outcome)
        SEEN[f"claim {'won' if claim else 'lost'} on {row.state if row else 'no row'}"] += 1
        if claim is None or row is None:
            if row is None:
                assert outcome.row is None
            elif row.state in (P, R) and not keep:
                # In progress: the duplicate waits (on_in_progress="wait" re-queues it
                # with a backoff) and comes back to replay the outcome, or take over.
                self.messages.append(Message(msg.task, msg.k, msg.v, msg.task_id,
                                             now + timedelta(seconds=1)))
            return
        row.attempt += 1
        assert claim.job_id == row.job_id and claim.attempt == row.attempt
        won = self.won.setdefault(row.job_id, set())
        assert row.attempt not in won and all(a < row.attempt for a in won), won
        won.add(row.attempt)
        row.state, row.task_id, row.not_before, row.updated = R, msg.task_id, None, now
        row.lease = now + timedelta(seconds=LEASE)
        attempt = Attempt(row, claim, worker)
        self.attempts.append(attempt)
        # The runner's own limit (runner.Run.exhausted): past max_attempts since the last
        # reset, the claim dead-letters the key instead of running the body.
        exhausted = claim.attempt > MAX_ATTEMPTS and claim.attempts() > MAX_ATTEMPTS
        assert exhausted is (row.attempt - row.reset_at > MAX_ATTEMPTS)
        if exhausted:
            assert claim.fail(RuntimeError("dead-lettered"), "dead_lettered", "dead-lettered")
            SEEN["claim past max_attempts dead-lettered"] += 1
            row.state, row.lease, attempt.done = F, None, True

    # The body of a running attempt goes on: one rule with the way it goes as a choice
    # (Hypothesis enables a random subset of the rules in each example, so fewer, wider
    # rules meet more often: a take-over needs publish, deliver, time and body together).
    @precondition(lambda self: self.running())
    @rule(pick=st.integers(0, 99), how=st.sampled_from(
        ["heartbeat", "succeed", "fail", "retry 0", "retry 5", "retry 120", "crash",
         "crash, redelivered"]))
    def body(self, pick: int, how: str) -> None:
        attempt = self.running()[pick % len(self.running())]
        if how == "heartbeat":
            self.heartbeat(attempt)
        elif how in ("succeed", "fail"):
            self.commit(attempt, how == "succeed")
        elif how.startswith("retry"):
            self.retry(attempt, int(how.split()[1]))
        else:
            self.crash(attempt, how.endswith("redelivered"))

    def heartbeat(self, attempt: Attempt) -> None:
        SEEN[f"heartbeat {'by the holder' if self.owns(attempt) else 'fenced out'}"] += 1
        if self.owns(attempt):
            attempt.claim.heartbeat()
            attempt.row.lease = self.now() + timedelta(seconds=LEASE)
            attempt.row.updated = self.now()
        else:
            with pytest.raises(ClaimLost):
                attempt.claim.heartbeat()

    def commit(self, attempt: Attempt, ok: bool) -> None:
        """The body ends: success, or a failure Celery will not retry. Only the holder of
        the row's attempt writes; a fenced-out one leaves a late_finish line and nothing
        else."""
        attempt.done = True
        owner, row, claim = self.owns(attempt), attempt.row, attempt.claim
        late = self.late_finishes(claim.job_id)
        result = {"worker": attempt.worker, "attempt": claim.attempt, "v": row.v}
        moved = claim.succeed(result) if ok else claim.fail(RuntimeError(str(result)))
        assert moved is owner, (attempt, row)
        SEEN[f"{'commit' if ok else 'failure'} {'by the holder' if owner else 'fenced out'}"] += 1
        if owner:
            row.state, row.lease, row.updated = (S if ok else F), None, self.now()
            row.result = result if ok else None
        elif MOVES["late_finish"].recorded and self.by_id(claim.job_id) is not None:
            assert self.late_finishes(claim.job_id) == late + 1

    def retry(self, attempt: Attempt, delay: int) -> None:
        """``self.retry(countdown=delay)``: Celery sends the retry (same task id, an ETA)
        and the claim goes back to PENDING, held for that message until its ETA."""
        attempt.done = True
        eta = self.now() + timedelta(seconds=delay)
        owner = self.owns(attempt)
        moved = attempt.claim.schedule_retry(eta, "retry: model")
        assert moved is owner
        SEEN[f"retry {'by the holder' if owner else 'fenced out'}"] += 1
        row = attempt.row
        self.messages.append(Message(row.task, row.k, row.v, attempt.claim.task_id, eta))
        if owner:
            row.state, row.not_before, row.lease, row.updated = P, eta, None, self.now()

    def crash(self, attempt: Attempt, redeliver: bool) -> None:
        """The worker dies mid-body; its claim stays until its lease expires.
        ``redeliver``: the broker delivers its unacknowledged message again."""
        attempt.done = True
        if redeliver:
            row = attempt.row
            self.messages.append(Message(row.task, row.k, row.v, attempt.claim.task_id))

    # -- time and recovery ---------------------------------------------------------------

    @rule(seconds=st.sampled_from([0, 1, 30, LEASE + 1, DISPATCH_TIMEOUT + 1,
                                   MAX_BACKOFF + 1]))
    def advance(self, seconds: int) -> None:
        """Time passes; 0: just beyond the earliest live lease, whose holder is then
        presumed dead (a zombie, if it is in fact still running)."""
        leases = sorted(r.lease for r in self.rows.values()
                        if r.state is R and r.lease and r.lease >= self.now())
        if seconds == 0 and leases:
            self.clock.move_to(leases[0] + timedelta(seconds=1))
        else:
            self.clock.tick(timedelta(seconds=seconds or 1))

    @rule()
    def reap(self) -> None:
        """One real recovery pass: lost messages sent again (or given up on), stale claims
        handed back; every other row stays as it was."""
        now = self.now()
        lost, stale = [], []
        for row in self.rows.values():
            wait = min(DISPATCH_TIMEOUT * 2 ** row.dispatch_count, MAX_BACKOFF)
            due = now - timedelta(seconds=wait)
            if row.state is P and row.updated < due and (
                    row.not_before is None or row.not_before < due):
                lost.append(row)
            elif row.state is R and row.lease is not None and row.lease < now:
                stale.append(row)
        report = sweep.reap()
        for what, counts in report.as_dict().items():
            SEEN[f"recovery {what}"] += sum(counts.values())
        sent = self.take_sent()
        for row in lost:
            row.updated = now
            if row.dispatch_count >= MAX_REDISPATCHES:
                row.state, row.lease = F, None
                assert key_of(row.task, row.k) not in sent
            else:
                row.dispatch_count += 1
                row.task_id = sent.pop(key_of(row.task, row.k))
        for row in stale:
            self.handed_back(row, sent.pop(key_of(row.task, row.k), None))
        assert not sent, f"sent again unexpectedly: {sent}"

    # -- operators -----------------------------------------------------------------------

    @precondition(lambda self: self.rows)
    @rule(pick=st.integers(0, 99))
    def look(self, pick: int) -> None:
        """An operator opens a job in the admin; they may act on it much later."""
        row = list(self.rows.values())[pick % len(self.rows)]
        self.snapshots.append(Job.objects.get(pk=row.job_id))

    @precondition(lambda self: self.rows or self.snapshots)
    @rule(action=st.sampled_from(["retry", "release", "resolve", "forget"]),
          pick=st.integers(0, 99), stale=st.booleans())
    def operate(self, action: str, pick: int, stale: bool) -> None:
        """An operator action on the job as they saw it: now, or when they looked."""
        if stale and self.snapshots:
            seen = self.snapshots[pick % len(self.snapshots)]
        elif self.rows:
            seen = Job.objects.get(pk=list(self.rows.values())[pick % len(self.rows)].job_id)
        else:
            return
        row = self.by_id(seen.pk)
        event = {"retry": "reset", "release": "released", "resolve": "resolved"}.get(action)
        applies = (State(seen.state) in MOVES[event].sources if event
                   else seen.state != R)
        if not applies:
            expect = actions.Outcome.WRONG_STATE
        elif row is None or (row.state, row.attempt) != (State(seen.state), seen.attempt):
            expect = actions.Outcome.RACED
        else:
            expect = actions.Outcome.DONE
        call = {"retry": actions.retry, "release": actions.release, "forget": actions.forget,
                "resolve": lambda job, actor: actions.resolve(job, actor=actor, note="checked")}
        result = call[action](seen, actor="ops")
        sent = self.take_sent()
        assert result.outcome is expect, (action, seen.state, seen.attempt, row)
        SEEN[f"operator {action}: {expect.value}"] += 1
        if expect is not actions.Outcome.DONE or row is None:
            assert not sent
            return
        now, key = self.now(), key_of(row.task, row.k)
        row.updated = now
        if action == "retry":
            row.state, row.not_before, row.lease, row.reset_at = P, None, None, row.attempt
            row.task_id, row.dispatch_count = sent.pop(key), row.dispatch_count + 1
        elif action == "release":
            self.handed_back(row, sent.pop(key, None))
        elif action == "resolve":
            row.state, row.lease = S, None
        else:
            del self.rows[key]
            self.succeeded.pop(row.job_id, None)
        assert not sent
