"""System checks of the settings (``manage.py check``): every ``CELERY_IDEM_*`` value
(``conf.problems``: E012, and E002, E007, E020 for the settings that have their own id),
the Celery serializers (E013), and prepared statements behind a transaction pooler (E014).
A bad value also raises ``ConfigurationError`` at its first use (``conf.validate``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core import checks

from . import checks as checks_module
from . import conf
from .check_ids import CHECKS
from .checks import TAG, setting

#: What a serializer or an accepted content type may be: JSON, by name or by MIME type.
JSON = frozenset({"json", "application/json"})
#: PgBouncer's default port.
PGBOUNCER_PORT = 6432


@checks.register(TAG)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Every setting's type and range, each under its id (the message names the
    setting and the fix)."""
    return [CHECKS[s.check.removeprefix("celery_idem.")](error)
            for s, error in conf.problems()]


@checks.register(TAG)
def check_serializers(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E013: a serializer, or an accepted content type, other than JSON."""
    celery = checks_module._celery_app().conf
    messages = []
    for name in ("task_serializer", "result_serializer"):
        value = celery.get(name)
        if value is not None and str(value).lower() not in JSON:
            messages.append(CHECKS["E013"](
                f"{_django_name(name)} is {value!r}: celery-idem keeps and re-sends "
                "messages as JSON, and workers that accept JSON only refuse the others"))
    for name in ("accept_content", "result_accept_content"):
        value = celery.get(name)
        other = [v for v in value or () if str(v).lower() not in JSON]
        if other:
            messages.append(CHECKS["E013"](
                f"{_django_name(name)} accepts {', '.join(map(repr, other))}: a message "
                "or result in such a format is not JSON, which celery-idem stores and "
                "re-sends"))
    return messages


def _django_name(name: str) -> str:
    namespace = getattr(checks_module._celery_app(), "namespace", None) or "CELERY"
    return f"{namespace}_{name.upper()}"


@checks.register(TAG)
def check_pooled_prepared(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E014: CELERY_IDEM_PREPARED_STATEMENTS on where the job database's settings say it
    goes through a transaction pooler."""
    alias = setting("DATABASE")
    if not setting("PREPARED_STATEMENTS") or alias is None:
        return []
    config = django_settings.DATABASES.get(alias, {})
    signs = pooler_signs(config) if "postgresql" in config.get("ENGINE", "") else []
    if not signs:
        return []
    return [CHECKS["E014"](
        f"CELERY_IDEM_PREPARED_STATEMENTS is on, but DATABASES[{alias!r}] goes through a "
        f"transaction pooler ({'; '.join(signs)}): a statement prepared on one server "
        "session is missing, or already exists, on the next")]


def pooler_signs(config: dict[str, Any]) -> list[str]:
    """What in a ``DATABASES`` entry says its connection goes through a transaction
    pooler (the server itself cannot tell: PgBouncer passes every query through)."""
    signs = []
    if str(config.get("PORT") or "") == str(PGBOUNCER_PORT):
        signs.append(f"its PORT is {PGBOUNCER_PORT}, PgBouncer's")
    if config.get("DISABLE_SERVER_SIDE_CURSORS"):
        signs.append("DISABLE_SERVER_SIDE_CURSORS is on, as Django asks behind one")
    if "bouncer" in str(config.get("HOST") or "").lower():
        signs.append(f"its HOST is {config['HOST']!r}")
    return signs
