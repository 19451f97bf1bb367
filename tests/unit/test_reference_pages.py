"""docs/reference/settings.md and checks.md are the registries' own pages: regenerate
them (``python -m celery_idem.docs_reference --write``) when a setting or a check changes."""

from __future__ import annotations

import pytest

from celery_idem.docs_reference import PAGES, ROOT


@pytest.mark.parametrize("path", sorted(PAGES))
def test_the_committed_reference_page_is_the_generated_one(path):
    committed = (ROOT / path).read_text() if (ROOT / path).exists() else ""
    assert committed == PAGES[path](), (
        f"{path} is out of date: run python -m celery_idem.docs_reference --write")


def test_every_check_id_a_check_reports_is_registered():
    """A check id used in the code is one the registry (and so the page) has."""
    import re

    from celery_idem.check_ids import CHECKS

    used = set()
    for source in (ROOT / "celery_idem").rglob("*.py"):
        used |= set(re.findall(r'CHECKS\["(\w+)"\]', source.read_text()))
        assert not re.search(r'id="celery_idem\.[EW]\d+"', source.read_text()), (
            f"{source}: build check messages from celery_idem.check_ids.CHECKS")
    assert used <= set(CHECKS)
