"""Canonical JSON of a task's bound arguments, and its fingerprint.

Two calls that a JSON round trip cannot tell apart (dict order, tuple or list) have the
same fingerprint; anything JSON cannot carry faithfully is refused up front, because the
worker sees the arguments only after the broker's JSON round trip. So is a NUL character
in any string: PostgreSQL cannot store ``\u0000`` in ``text`` or ``jsonb``, and finding
out at the database would fail the caller's transaction instead of its call.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from .errors import ArgumentsNotJSON

_SCALARS = (bool, int, type(None))
_EXACT_SCALARS = frozenset(_SCALARS)
NUL = "\x00"


def _plain_json(value: Any) -> bool:
    """Whether ``value`` passes ``check_json``: the same walk without the paths, which
    only an error message needs (building one per item was most of the check's cost)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            if NUL in item:
                return False
        elif kind is dict:
            for k in item:
                if type(k) is not str or NUL in k:
                    return False
            stack.extend(item.values())
        elif kind is list or kind is tuple:
            stack.extend(item)
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif kind not in _EXACT_SCALARS:
            return False  # a subclass or anything else: the full check decides
    return True


def check_json(value: Any, where: str = "arguments") -> None:
    """Raise ArgumentsNotJSON unless ``value`` is made of plain JSON types only."""
    if _plain_json(value):
        return
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if NUL in item:
                raise ArgumentsNotJSON(_nul_message(path))
            continue
        if isinstance(item, _SCALARS):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise ArgumentsNotJSON(f"{path} is {item!r}, which JSON cannot carry")
            continue
        if isinstance(item, list | tuple):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(item))
            continue
        if isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    raise ArgumentsNotJSON(
                        f"{path} has key {k!r} of type {type(k).__name__}; JSON keys are strings"
                    )
                if NUL in k:
                    raise ArgumentsNotJSON(_nul_message(f"a key of {path}"))
                stack.append((v, f"{path}[{k!r}]"))
            continue
        if _is_model_instance(item):
            raise ArgumentsNotJSON(
                f"{path} is a {type(item).__name__} model instance, not plain JSON: pass its "
                f"primary key ({type(item).__name__.lower()}.pk) and load it in the task, "
                "which also reads the row as it is when the task runs"
            )
        raise ArgumentsNotJSON(
            f"{path} is a {type(item).__name__} ({item!r:.60}), not plain JSON: "
            "pass str(value), a number, or a dict/list of them"
        )


def _nul_message(path: str) -> str:
    return (f"{path} contains a NUL character (\\u0000), which PostgreSQL cannot store: "
            "remove it or encode the value (e.g. base64)")


def _is_model_instance(value: Any) -> bool:
    # Imported here: this module must stay importable without Django configured.
    try:
        from django.db.models import Model
    except ImportError:  # pragma: no cover - Django is a dependency
        return False
    return isinstance(value, Model)


#: The one encoder: ``json.dumps`` with options other than its defaults builds a new
#: JSONEncoder on every call (and the fingerprint runs on both sides of every task);
#: an encoder keeps no state between calls, so one instance serves every thread.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(value: Any) -> str:
    """Serialise ``value`` the one way: sorted keys, no spaces, unicode kept as is."""
    check_json(value)
    return _CANONICAL.encode(value)


def fingerprint(value: Any) -> str:
    """SHA-256 (hex) of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()
