"""Byte-identical outputs on Python 3.11-3.13 (simulators/selfcheck/cross_version.py).

The comparison needs another CPython with the simulator's dependencies: the interpreters
named in ``RLHARNESS_OTHER_PYTHONS`` (``os.pathsep``-separated). ``.ci/run`` sets it when it
finds Python 3.12 or 3.13 on the machine (and says so); without it the cross-version test
skips and says why. The tests of the comparison itself run the other side in a fresh
process of this interpreter that is made to differ."""

from __future__ import annotations

import os
import platform
import sys

import pytest

from simulators.selfcheck import cross_version
from simulators.selfcheck.cross_version import dependency_versions, differences, hashes_under, output_hashes

OTHER_PYTHONS = [p for p in os.environ.get("RLHARNESS_OTHER_PYTHONS", "").split(os.pathsep) if p]
SMALL = ["", "examples/scenarios/default.yaml", "examples/scenarios/lost_finish.yaml"]


@pytest.fixture(scope="module")
def our_hashes():
    return output_hashes()  # once for every other interpreter


@pytest.mark.skipif(
    not OTHER_PYTHONS,
    reason="no other CPython given (RLHARNESS_OTHER_PYTHONS is unset; "
    ".ci/run sets it when it finds Python 3.12 or 3.13)",
)
@pytest.mark.parametrize("python", OTHER_PYTHONS)
def test_every_small_bundled_run_and_fuzz_seed_gives_the_same_bytes_on_another_python(python, our_hashes):
    ours = our_hashes
    version, deps, theirs = hashes_under(python)
    assert version.split(".")[:2] != platform.python_version().split(".")[:2], (
        f"{python} is Python {version}, the version running the tests: RLHARNESS_OTHER_PYTHONS must name another one"
    )
    assert differences(ours, theirs, platform.python_version(), version) == [], (
        f"dependencies: here {dependency_versions()}; there {deps}"
    )
    assert (
        len(ours)
        == (len(cross_version.bundled_scenarios()) + len(cross_version.FUZZ_SEEDS) + len(cross_version.EXPLORE_RUNS))
        > 60
    )
    assert (
        sum("--explore-strategy random" in run for run in ours)
        == sum("--explore-strategy pct" in run for run in ours)
        > 0
    )


def test_a_fresh_interpreter_that_models_differently_is_reported_per_file(fresh_process_decodes_one_more_token):
    fresh_process_decodes_one_more_token()  # the other side decodes one token more per request
    ours = output_hashes(SMALL, range(2))
    version, deps, theirs = hashes_under(sys.executable, SMALL, range(2))
    assert deps == dependency_versions() and "numpy " in deps
    found = differences(ours, theirs, "A", "B")
    assert version == platform.python_version()
    assert "(default) events.jsonl: Python A " in "\n".join(found)
    assert any(line.startswith("fuzz seed 0 events.jsonl: ") for line in found)
    assert not any("scenario.yaml" in line for line in found)  # the input is the same on both sides
    assert differences(ours, ours, "A", "A") == []


def test_the_same_interpreter_gives_the_same_hashes():
    explored = [["", 4, "random"], ["", 4, "pct"]]
    version, _deps, theirs = hashes_under(sys.executable, SMALL, range(2), explore=explored)
    ours = output_hashes(SMALL, range(2), explored)
    assert differences(ours, theirs, version, version) == []
    assert set(ours) == {
        "(default)",
        SMALL[1],
        SMALL[2],
        "fuzz seed 0",
        "fuzz seed 1",
        "(default) --explore 4 --explore-strategy random",
        "(default) --explore 4 --explore-strategy pct",
    }
    assert ours["(default) --explore 4 --explore-strategy pct"] != ours["(default)"]
    assert set(ours["(default)"]) == set(cross_version.COMPARED_FILES)


def test_an_interpreter_without_the_simulators_dependencies_is_an_error(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    (site / "orjson.py").write_text("raise ImportError('hidden by the test')\n")
    monkeypatch.setenv("PYTHONPATH", str(site))  # hashes_under puts the checkout first, then this
    with pytest.raises(RuntimeError, match=r"lacks the simulator's orjson$"):
        hashes_under(sys.executable, SMALL[:1], range(0))
    with pytest.raises(RuntimeError, match="cannot run it"):
        hashes_under(str(tmp_path / "no-such-python"))


def test_differences_name_a_run_only_one_side_has():
    found = differences({"a": {"f": "1" * 64}}, {"b": {"f": "2" * 64}}, "3.11.7", "3.13.0")
    assert found == [
        "a f: Python 3.11.7 111111111111 != Python 3.13.0 None",
        "b f: Python 3.11.7 None != Python 3.13.0 222222222222",
    ]
