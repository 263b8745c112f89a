"""Fixtures shared by the simulator tests."""

from __future__ import annotations

import os
import textwrap

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture
def fresh_process_decodes_one_more_token(tmp_path, monkeypatch):
    """A function that, once called, makes every *fresh* Python process started after it
    (not this one) model each request as decoding one token more, through a
    ``sitecustomize`` on its PYTHONPATH: the determinism checks that rerun a scenario in
    a fresh interpreter must then report a divergence at the first record where a
    request's length shows."""
    return lambda: _install(tmp_path, monkeypatch)


def _install(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        textwrap.dedent("""
        import simulators.pipelines.workload as workload
        _draw = workload.Collector.draw
        def draw(self, n):
            requests = _draw(self, n)
            for r in requests:
                r.tokens += 1
            return requests
        workload.Collector.draw = draw
    """)
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), ROOT]))
    return site
