"""Every metric celery-idem exposes, and which transition counts in which: data only.

The Prometheus and OpenTelemetry renderings (``metrics.prometheus``, ``metrics.otel``)
build their instruments from ``METRICS``; the recorder (``metrics.recorder``) counts a
transition by looking it up in ``COUNTED``. docs/reference/metrics.md lists the same names, and a
test checks that the Grafana dashboard in docs/ queries none that is not here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..states import State


@dataclass(frozen=True)
class Metric:
    """One metric: its name (a counter's without Prometheus's ``_total``), its kind
    ("counter", "histogram" or "gauge"), what it means, and its label names."""

    name: str
    kind: str
    help: str
    labels: tuple[str, ...] = ()

    def series(self) -> frozenset[str]:
        """The names Prometheus's text format shows for it."""
        if self.kind == "counter":
            return frozenset({f"{self.name}_total", f"{self.name}_created"})
        if self.kind == "histogram":
            return frozenset(f"{self.name}_{end}" for end in ("bucket", "sum", "count",
                                                              "created"))
        return frozenset({self.name})


# -- counters, from the transition signal ---------------------------------------------------

INTENTS = Metric("celery_idem_intents", "counter",
                 "Intents written (a key published for the first time).", ("task",))
CLAIMS = Metric("celery_idem_claims", "counter",
                "Claims won: kind claimed (a fresh key) or taken_over (a stale claim's lease "
                "had expired).", ("task", "kind"))
COMMITS = Metric("celery_idem_commits", "counter",
                 "Outcomes committed by the claim's holder: succeeded or failed.",
                 ("task", "outcome"))
DUPLICATES = Metric("celery_idem_duplicates", "counter",
                    "Duplicate messages absorbed: replayed (the stored outcome returned) or "
                    "waited (put back to wait for a live claim, once per wait).",
                    ("task", "outcome"))
RETRIES = Metric("celery_idem_retries", "counter",
                 "Retries scheduled by a body (self.retry, autoretry).", ("task",))
RECOVERIES = Metric("celery_idem_recoveries", "counter",
                    "Claims and messages recovered: released (a lost worker's claim handed "
                    "back), redispatched (a lost message sent again), taken_over (a stale "
                    "claim claimed again), undeliverable (given up on after its re-sends).",
                    ("task", "kind"))
DEAD_LETTERS = Metric("celery_idem_dead_letters", "counter",
                      "Jobs ended FAILED without their body failing: reason max_attempts "
                      "(attempts used up) or undeliverable (never claimed).",
                      ("task", "reason"))
UNCERTAIN = Metric("celery_idem_uncertain", "counter",
                   "Jobs parked UNCERTAIN (lost mid-body, must not re-run blindly): an "
                   "operator decides.", ("task",))
EXPIRED = Metric("celery_idem_expired", "counter",
                 "Jobs whose message expired before any worker claimed it.", ("task",))
LATE_FINISHES = Metric("celery_idem_late_finishes", "counter",
                       "Attempts that finished after losing their claim (fenced out: their "
                       "outcome was not recorded).", ("task",))

# -- from pairs of transitions in one process -----------------------------------------------

CLAIM_TO_COMMIT = Metric("celery_idem_claim_to_commit_seconds", "histogram",
                         "Seconds from a claim to its holder's commit (the body's run).",
                         ("task", "outcome"))
#: Buckets for bodies from milliseconds to an hour.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                   60.0, 300.0, 900.0, 3600.0)

# -- gauges, from the database at scrape time (metrics.gauges) ------------------------------

JOBS = Metric("celery_idem_jobs", "gauge",
              "Jobs per task and state (SUCCEEDED estimated from the planner's statistics "
              "on PostgreSQL).", ("task", "state"))
OLDEST_STALE_CLAIM = Metric("celery_idem_oldest_stale_claim_age_seconds", "gauge",
                            "Seconds since the lease of the oldest stale claim (RUNNING past "
                            "its lease) expired; 0 when there is none.")
OLDEST_NEVER_SENT = Metric("celery_idem_oldest_never_sent_intent_age_seconds", "gauge",
                           "Age in seconds of the oldest intent whose message never left "
                           "(its producer died between its commit and the send); 0 when "
                           "there is none.")
GAUGES_UP = Metric("celery_idem_gauges_up", "gauge",
                   "1 when the last reading of the gauges from the database succeeded.")

#: Every metric, by name.
METRICS: dict[str, Metric] = {m.name: m for m in [
    INTENTS, CLAIMS, COMMITS, DUPLICATES, RETRIES, RECOVERIES, DEAD_LETTERS, UNCERTAIN,
    EXPIRED, LATE_FINISHES, CLAIM_TO_COMMIT, JOBS, OLDEST_STALE_CLAIM, OLDEST_NEVER_SENT,
    GAUGES_UP]}
COUNTERS = [m for m in METRICS.values() if m.kind == "counter"]
GAUGES = [m for m in METRICS.values() if m.kind == "gauge"]

#: What one counted transition adds to: (metric, its labels besides ``task``).
Count = tuple[Metric, dict[str, str]]
_P, _R = State.PENDING.value, State.RUNNING.value

#: Which transitions count where, by (event, from-state); a from-state of None: any.
COUNTED: dict[tuple[str, str | None], tuple[Count, ...]] = {
    ("published", None): ((INTENTS, {}),),
    ("claimed", None): ((CLAIMS, {"kind": "claimed"}),),
    ("taken_over", None): ((CLAIMS, {"kind": "taken_over"}),
                           (RECOVERIES, {"kind": "taken_over"})),
    ("succeeded", None): ((COMMITS, {"outcome": "succeeded"}),),
    # An optimistic atomic body's commit: no claim came before it.
    ("committed", None): ((COMMITS, {"outcome": "succeeded"}),),
    ("failed", None): ((COMMITS, {"outcome": "failed"}),),
    ("duplicate", None): ((DUPLICATES, {"outcome": "replayed"}),),
    ("retry_scheduled", None): ((RETRIES, {}),),
    ("released", None): ((RECOVERIES, {"kind": "released"}),),
    ("redispatched", None): ((RECOVERIES, {"kind": "redispatched"}),),
    # A RUNNING job dead-lettered used up its attempts (the runner, recovery); a PENDING
    # one was never claimed after its re-sends (recovery: undeliverable).
    ("dead_lettered", _R): ((DEAD_LETTERS, {"reason": "max_attempts"}),),
    ("dead_lettered", _P): ((DEAD_LETTERS, {"reason": "undeliverable"}),
                            (RECOVERIES, {"kind": "undeliverable"})),
    ("uncertain", None): ((UNCERTAIN, {}),),
    ("expired", None): ((EXPIRED, {}),),
    ("late_finish", None): ((LATE_FINISHES, {}),),
}
#: Announced moves no metric counts: history detail and operator actions, which the
#: admin and the logs show (a message not sent shows in the oldest never-sent gauge).
NOT_COUNTED = frozenset({"replaced", "reset", "resolved", "attempt_lost", "step_completed",
                         "send_failed"})
#: What a duplicate put back to wait adds to (``signals.duplicate_waiting``).
WAITED: Count = (DUPLICATES, {"outcome": "waited"})
#: The moves that start and end the claim-to-commit latency.
STARTS = frozenset({"claimed", "taken_over"})
ENDS = {"succeeded": "succeeded", "failed": "failed"}


def counted(event: str, from_state: str | None) -> tuple[Count, ...]:
    """What the transition ``event`` from ``from_state`` adds to (nothing if not counted)."""
    return COUNTED.get((event, from_state)) or COUNTED.get((event, None), ())
