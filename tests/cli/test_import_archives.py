"""Every config of the pinned upstream archives through its importer: each is imported or
refused with a key and a reason, none crashes, and docs/importers.md shows today's table.
Skips (saying how to point it at them) where the archives are absent."""

from __future__ import annotations

import os

import pytest

from simulators.config_import import table

UPSTREAM = table.upstream_dir()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(UPSTREAM is None, reason=table.HOW)]
DOC = os.path.join(table.ROOT, "docs", "importers.md")


@pytest.fixture(scope="module")
def rows():
    return table.build(UPSTREAM)


def test_every_pinned_config_is_imported_or_refused_with_its_key(rows):
    assert len(rows) > 400
    for r in rows:
        assert r.imported or (r.key and r.reason), r
    imported = {a: sum(r.imported for r in rows if r.archive == a) for a in (table.NEMO, table.ROLL, table.RLIX[0])}
    assert all(imported.values()), imported


def test_the_docs_show_this_table(rows):
    with open(DOC, encoding="utf-8") as fh:
        doc = fh.read()
    shown = doc.split(table.BEGIN, 1)[1].split(table.END, 1)[0]
    expected = table.render(rows).split(table.BEGIN, 1)[1].split(table.END, 1)[0]
    assert shown == expected, "regenerate: python -m simulators.config_import.table --write docs/importers.md"
