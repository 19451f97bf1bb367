"""What a PostgreSQL session carries beyond what its connection settings gave it: the
state a transaction pooler would hand, with the session, to its next client."""

from __future__ import annotations

from typing import Any

#: One query per kind of session state, each run on the session itself.
QUERIES = {
    "prepared statements": "SELECT statement FROM pg_prepared_statements ORDER BY 1",
    # SET (source 'session') or a startup option (source 'client'): compared with a fresh
    # session of the same settings, which has the ones Django itself sends.
    "settings": "SELECT name || '=' || setting FROM pg_settings"
                " WHERE source IN ('session', 'client') ORDER BY 1",
    "advisory locks": "SELECT objid::text FROM pg_locks"
                      " WHERE locktype = 'advisory' AND pid = pg_backend_pid()",
    "temporary tables": "SELECT relname::text FROM pg_class"
                        " WHERE relnamespace = pg_my_temp_schema() AND relkind = 'r'",
    "listening": "SELECT pg_listening_channels()::text",
    "cursors": "SELECT name::text FROM pg_cursors",
}


def session_state(wrapper: Any) -> dict[str, list[str]]:
    """Each kind of session state of ``wrapper``'s session (a Django DatabaseWrapper),
    read without preparing anything on it."""
    wrapper.ensure_connection()
    raw = wrapper.connection
    return {kind: [row[0] for row in raw.execute(sql, prepare=False).fetchall()]
            for kind, sql in QUERIES.items()}


def fresh_state(wrapper: Any) -> dict[str, list[str]]:
    """The same of a new session opened with plain Django's settings of ``wrapper``'s
    database (Django's own startup parameters and settings included)."""
    import copy

    from django.db import connections
    from django.db.utils import load_backend

    settings_dict = copy.deepcopy(connections[wrapper.alias].settings_dict)
    fresh = load_backend(settings_dict["ENGINE"]).DatabaseWrapper(settings_dict, wrapper.alias)
    try:
        return session_state(fresh)
    finally:
        fresh.close()
