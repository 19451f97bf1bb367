"""The stored routines the PostgreSQL backend calls are the ones its migrations install
(celery_idem/backends/routines.py): a change to a rendered statement needs a migration,
as a change to a model does."""

from __future__ import annotations

import importlib
import pkgutil

from celery_idem import migrations
from celery_idem.backends import routines


def installed_by_migrations() -> dict[str, str]:
    found: dict[str, str] = {}
    for module in pkgutil.iter_modules(migrations.__path__):
        found.update(getattr(importlib.import_module(f"celery_idem.migrations.{module.name}"),
                             "ROUTINES", {}))
    return found


def test_every_routine_the_backend_calls_is_installed_as_rendered():
    installed = installed_by_migrations()
    stale = [r.name for r in routines.hot() if installed.get(r.name) != r.create]
    assert not stale, (
        f"{stale}: a rendered statement changed; add a migration installing the ROUTINES "
        "that `python -m celery_idem.backends.routines` prints (the initial migration shows "
        "how), keeping the old ones for workers of the previous release")


def test_a_routine_is_the_statement_with_typed_parameters():
    claim = next(r for r in routines.hot() if r.label == "claim")
    assert "%(" not in claim.body and "p_namespace" in claim.body
    assert claim.call.startswith(
        f"SELECT * FROM {claim.name}(%(unflushed)s, %(namespace)s, %(key)s")
    assert claim.signature.startswith("p_unflushed boolean, p_namespace text")
    assert "p_lease timestamptz" in claim.signature and "p_attempt" not in claim.signature
    assert routines.statement_of(claim.call.replace("%(namespace)s", "$1")) == claim.statement
    assert routines.statement_of("SELECT 1") == "SELECT 1"


def test_the_intent_and_a_first_claim_share_one_routine():
    statements = [r.statement for r in routines.hot()]
    assert len(statements) == len(set(statements))
    assert [r.label for r in routines.hot()] == [
        "insert", "claim", "succeed", "succeed_final", "fail", "commit"]
