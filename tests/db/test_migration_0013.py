"""Migration 0013 marks the jobs that were dead-lettered before the flag existed: a FAILED
job whose last move into FAILED was ``dead_lettered``, from its history."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.db import connection
from django.utils import timezone

from celery_idem.models import Job, Transition

pytestmark = pytest.mark.django_db

migration = importlib.import_module("celery_idem.migrations.0013_dead_letter_flag_pending_levels")


def job_with_history(key: str, state: str, events: list[tuple[str, str]]) -> Job:
    job = Job.objects.create(namespace="n", key=key, task_name="t", fingerprint="f",
                             state=state)
    at = timezone.now()
    for n, (event, to_state) in enumerate(events):
        Transition.objects.create(job=job, event=event, to_state=to_state, attempt=n + 1,
                                  at=at)  # the same instant: the id decides the order
    return job


def test_only_the_jobs_whose_last_failure_was_a_dead_letter_are_marked():
    given_up = job_with_history("a", "FAILED", [("dead_lettered", "FAILED")])
    reset_then_failed = job_with_history("b", "FAILED", [
        ("dead_lettered", "FAILED"), ("reset", "PENDING"), ("failed", "FAILED")])
    failed_then_given_up = job_with_history("c", "FAILED", [
        ("failed", "FAILED"), ("reset", "PENDING"), ("dead_lettered", "FAILED")])
    reset_and_pending = job_with_history("d", "PENDING", [
        ("dead_lettered", "FAILED"), ("reset", "PENDING")])
    Job.objects.update(dead_lettered=False)

    migration.mark_dead_lettered(apps, SimpleNamespace(connection=connection))

    marked = set(Job.objects.filter(dead_lettered=True).values_list("key", flat=True))
    assert marked == {given_up.key, failed_then_given_up.key}
    assert {reset_then_failed.key, reset_and_pending.key}.isdisjoint(marked)
