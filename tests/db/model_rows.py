"""The model of tests/db/test_model.py: its settings, the two tasks it runs, what it
expects of each job row, the messages a broker would hold, the fake broker recovery and
operators re-send to, and the machine's bookkeeping (``ModelState``), on which the rules
(tests/db/model_rules.py) and the invariants (test_model.py) are written."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from celery import shared_task
from hypothesis.stateful import RuleBasedStateMachine

from celery_idem import IdempotentTask, claims
from celery_idem.models import Job, Transition
from celery_idem.states import State

T0 = datetime.fromisoformat("2030-01-01T12:00:00+00:00")
LEASE = 60
MAX_ATTEMPTS = 3
DISPATCH_TIMEOUT, MAX_BACKOFF, MAX_REDISPATCHES = 600, 2400, 2
WORKERS = ["w0/1", "w1/1", "w2/1"]
#: Mostly one key per task, so that claims, take-overs and late commits meet on it.
KEYS = [0, 0, 0, 1]
P, R, S, F, U = State.PENDING, State.RUNNING, State.SUCCEEDED, State.FAILED, State.UNCERTAIN


@shared_task(base=IdempotentTask, bind=True, idempotency_key="charge/{k}",
             max_attempts=MAX_ATTEMPTS, name="tests.model.charge")
def charge(self, k, v):
    return v


@shared_task(base=IdempotentTask, bind=True, idempotency_key="mail/{k}",
             max_attempts=MAX_ATTEMPTS, on_stale_claim="uncertain", name="tests.model.mail")
def mail(self, k, v):
    return v


TASKS = {t.name: t for t in (charge, mail)}
#: What the runs exercised (printed at the end: ``-s`` shows it).
SEEN: Counter[str] = Counter()


@dataclass
class Row:
    """What the model expects of one job row."""

    job_id: int
    task: str
    k: int
    v: int
    state: State = P
    attempt: int = 0
    task_id: str = ""
    lease: datetime | None = None
    not_before: datetime | None = None
    updated: datetime = T0
    dispatch_count: int = 0
    result: Any = None
    #: The attempt of the last operator reset (attempts count from it).
    reset_at: int = 0


@dataclass
class Attempt:
    """A won claim held by a simulated worker's body."""

    row: Row
    claim: claims.Claim
    worker: str
    done: bool = False


@dataclass
class Message:
    task: str
    k: int
    v: int
    task_id: str
    eta: datetime | None = None


@dataclass
class Sent:
    """What the (fake) broker got from recovery and operators: (namespace, key, task id)."""

    messages: list[tuple[str, str, str]] = field(default_factory=list)

    def __call__(self, job: Any, countdown: Any = None, task_id: str | None = None,
                 fresh: bool = False) -> str:
        assert task_id, "a re-send names its task id before it leaves"
        self.messages.append((job.namespace, job.key, task_id))
        return task_id


def key_of(task: str, k: int) -> tuple[str, str]:
    return task, f"{task.rsplit('.', 1)[-1]}/{k}"


class ModelState(RuleBasedStateMachine):
    """The machine's state, with no rule or invariant of its own."""

    clock: Any
    sent: Sent

    def __init__(self) -> None:
        super().__init__()
        Job.objects.all().delete()  # each example starts from an empty store
        self.clock.move_to(T0)
        self.sent.messages.clear()
        self.rows: dict[tuple[str, str], Row] = {}
        self.messages: list[Message] = []
        self.attempts: list[Attempt] = []
        self.snapshots: list[Job] = []
        #: job id -> (result, attempt) once SUCCEEDED, checked against the database.
        self.succeeded: dict[int, tuple[Any, int]] = {}
        #: job id -> every attempt number a claim won.
        self.won: dict[int, set[int]] = {}

    def teardown(self) -> None:
        Job.objects.all().delete()

    # -- helpers -------------------------------------------------------------------------

    def now(self) -> datetime:
        return datetime.now(tz=T0.tzinfo)

    def by_id(self, job_id: int) -> Row | None:
        return next((r for r in self.rows.values() if r.job_id == job_id), None)

    def late_finishes(self, job_id: int) -> int:
        return Transition.objects.filter(job_id=job_id, event="late_finish").count()

    def take_sent(self) -> dict[tuple[str, str], str]:
        """The re-sends since the last call, one per key at most, queued as messages."""
        out: dict[tuple[str, str], str] = {}
        for namespace, key, task_id in self.sent.messages:
            assert (namespace, key) not in out, f"{key} sent twice in one step"
            out[(namespace, key)] = task_id
            row = self.rows[(namespace, key)]
            self.messages.append(Message(row.task, row.k, row.v, task_id))
        self.sent.messages.clear()
        return out

    def handed_back(self, row: Row, task_id: str | None) -> None:
        """How a lost claim goes back (recovery.handback), by the task's declarations."""
        row.lease, row.updated = None, self.now()
        if row.task == mail.name:
            row.state = U
        elif row.attempt >= MAX_ATTEMPTS and row.attempt - row.reset_at >= MAX_ATTEMPTS:
            row.state = F
        else:
            assert task_id is not None, f"released {row} but sent nothing"
            row.state, row.task_id, row.dispatch_count = P, task_id, row.dispatch_count + 1
            return
        assert task_id is None, f"{row} was {row.state} and also sent again"

    def running(self) -> list[Attempt]:
        return [a for a in self.attempts if not a.done]

    def owns(self, attempt: Attempt) -> bool:
        row = self.rows.get(key_of(attempt.row.task, attempt.row.k))
        return (row is attempt.row and row.state is R
                and row.attempt == attempt.claim.attempt)
