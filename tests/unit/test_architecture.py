"""The structure the architecture page promises: its table is the code's, no cycles,
modules within the size guideline, every move labelled and every state styled."""

from __future__ import annotations

from celery_idem.states import MOVES, State, markdown_table

from .imports import PACKAGE, cycles, graph

ROOT = PACKAGE.parent


def test_the_architecture_page_shows_the_move_table_of_the_code():
    text = (ROOT / "docs" / "explanation" / "how-it-works.md").read_text()
    shown = text.split("<!-- moves:start -->\n", 1)[1].split("<!-- moves:end -->", 1)[0]
    assert shown == markdown_table()


def test_the_library_has_no_import_cycle():
    assert cycles(graph()) == []


#: A guideline for the reviewer, not a budget to split for: a module is one thing that
#: changes together. Past this, ask whether it holds two; if it is one, raise the
#: guideline here in the same change and say why. Never split a module into halves
#: that import each other's private names to pass it.
MODULE_LINES_GUIDELINE = 400


def test_no_library_module_is_past_the_size_guideline():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
            if "migrations" not in p.parts
            and (n := len(p.read_text().splitlines())) > MODULE_LINES_GUIDELINE}
    assert long == {}, (
        f"past {MODULE_LINES_GUIDELINE} lines: split by cohesion, or raise "
        "MODULE_LINES_GUIDELINE with the reason (tests/unit/test_architecture.py)")


def test_every_move_has_a_label_and_every_state_a_badge():
    css = (PACKAGE / "static" / "celery_idem" / "admin.css").read_text()
    assert all(str(m.label).strip() for m in MOVES.values())
    assert len({str(m.label) for m in MOVES.values()}) == len(MOVES)
    missing = [s for s in State if f".idem-state--{s.value.lower()}" not in css]
    assert missing == []


def test_the_import_reader_finds_a_cycle_when_there_is_one():
    """The cycle check itself can fail."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
