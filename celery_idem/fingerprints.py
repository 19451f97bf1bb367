"""Canonical JSON of a task's bound arguments, and its fingerprint.

Two calls that a JSON round trip cannot tell apart (dict order, tuple or list) have the
same fingerprint; anything JSON cannot carry faithfully is refused up front, because the
worker sees the arguments only after the broker's JSON round trip.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from .errors import ArgumentsNotJSON

_SCALARS = (str, bool, int, type(None))


def check_json(value: Any, where: str = "arguments") -> None:
    """Raise ArgumentsNotJSON unless ``value`` is made of plain JSON types only."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, path = stack.pop()
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
                stack.append((v, f"{path}[{k!r}]"))
            continue
        raise ArgumentsNotJSON(
            f"{path} is a {type(item).__name__} ({item!r:.60}), not plain JSON: "
            "pass str(value), a number, or a dict/list of them"
        )


def canonical_json(value: Any) -> str:
    """Serialise ``value`` the one way: sorted keys, no spaces, unicode kept as is."""
    check_json(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint(value: Any) -> str:
    """SHA-256 (hex) of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()
