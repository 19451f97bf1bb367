"""A clean start: the demo's database made afresh (SQLite: the var/ folder is wiped)."""

from __future__ import annotations

from urllib.parse import urlparse


def recreate_postgres(url: str) -> None:
    """Drop and create the database named in ``url`` (never a shared one: name your own)."""
    import psycopg
    from psycopg import sql

    parts = urlparse(url)
    name = parts.path.lstrip("/")
    if not name or name in ("postgres", "template0", "template1"):
        raise SystemExit(f"--database must name a database of the demo's own, not {name!r}")
    with psycopg.connect(host=parts.hostname or "127.0.0.1", port=parts.port or 5432,
                         user=parts.username or "postgres", password=parts.password or None,
                         dbname="postgres", autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
