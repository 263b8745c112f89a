"""docs/architecture.md's folder table is generated from the tree (docs/img/architecture.py):
it must match the code as it stands, and the generator must see a change to the layout."""

from __future__ import annotations

import importlib.util
import os
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _generator():
    spec = importlib.util.spec_from_file_location(
        "architecture_doc", os.path.join(ROOT, "docs", "img", "architecture.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_folder_table_matches_the_tree():
    doc, fresh = _generator().current_doc(ROOT)
    assert doc == fresh, "docs/architecture.md's folder table is out of date: run python docs/img/architecture.py"


def test_every_concept_folder_says_what_it_is():
    gen = _generator()
    sizes, _ = gen.scan(ROOT)
    assert len(sizes) > 25
    missing = [f for f in sizes if gen.concept_text(ROOT, f) == "(no package docstring)"]
    assert not missing, missing


def test_a_new_import_between_folders_shows_in_the_table(tmp_path):
    gen = _generator()
    # the model core alone is enough to see an edge inside it (the scan walks whatever packages exist)
    shutil.copytree(os.path.join(ROOT, "harness"), tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    before = gen.table(str(tmp_path))
    row = next(r for r in before.splitlines() if r.startswith("| `harness/refit/`"))
    assert "`harness/streaming/`" not in row
    (tmp_path / "harness" / "refit" / "planted.py").write_text("from harness.streaming import buffer\n")
    after = gen.table(str(tmp_path))
    row = next(r for r in after.splitlines() if r.startswith("| `harness/refit/`"))
    assert "`harness/streaming/`" in row
