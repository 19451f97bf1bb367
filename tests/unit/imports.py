"""The import graph of the library, read from its source (tests/unit/test_architecture.py)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "celery_idem"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        parts = module.split(".")
        keep = len(parts) - node.level + (1 if is_package else 0)
        base = ".".join(parts[:keep] + ([node.module] if node.module else []))
    names = [f"{base}.{alias.name}" for alias in node.names]
    return [base, *names]


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in ast.walk(node):
                if hasattr(child, "lineno"):
                    lines.add(child.lineno)
    return lines


def graph() -> dict[str, set[str]]:
    """Module -> the library modules it imports (anywhere in it, lazily or not), except
    imports only made for the type checker."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts}
    edges: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_lines(tree)
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                targets = _resolve(name, path.name == "__init__.py", node)
            # A package's own parents are imported before it anyway: not an edge.
            edges[name] |= {t for t in targets if t in paths and t != name
                            and not name.startswith(t + ".")}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle, as a path that returns to its start (depth-first)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return found
