"""One exit-code table: every code distinct, and the command line, a gate and the docs
agree on it. The docs table (docs/cli.md#exit-codes) is parsed, not restated here, so a
code changed in one place and not the others fails this test."""

from __future__ import annotations

import os
import re
from typing import Dict

import pytest

from harness.exit_codes import ExitCode
from rlharness.cli import main
from rlharness.gate import exit_code_from_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def docs_table() -> Dict[str, int]:
    """``{name: code}`` from the table under docs/cli.md's ``## Exit codes`` heading."""
    text = open(os.path.join(ROOT, "docs", "cli.md"), encoding="utf-8").read()
    section = text.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| `([A-Z_]+)` \|", section, flags=re.M)
    table = {name: int(code) for code, name in rows}
    assert len(table) == len(rows), f"a name twice in the docs table: {rows}"
    return table


def test_every_code_is_distinct():
    values = [int(m) for m in ExitCode.__members__.values()]
    assert len(values) == len(set(values)), values  # an alias would hide a second meaning
    assert len(set(docs_table().values())) == len(docs_table())


def test_the_docs_table_is_the_module():
    assert docs_table() == {m.name: int(m) for m in ExitCode}


def test_help_lists_every_code_of_the_table(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    epilog = capsys.readouterr().out.split("exit codes", 1)[1]
    listed = {int(c) for c in re.findall(r"^  (\d+) ", epilog, flags=re.M)}
    assert listed == set(docs_table().values())


def test_a_gate_and_the_gate_command_use_the_table():
    pytest.importorskip("torch")
    from gpu_gates.runtime import report as rep

    docs = docs_table()
    for status, name in ((rep.PASSED, "OK"), (rep.FAILED, "FINDING"), (rep.SKIPPED, "SKIPPED")):
        assert rep.exit_code_for(status) == docs[name], status
        assert exit_code_from_report({"status": status}) == docs[name], status
    assert exit_code_from_report({"status": "garbled"}) == docs["FINDING"]  # never a pass
    from gpu_gates.nccl_teardown import SPEC
    from gpu_gates.runtime.gate import build_parser

    epilog = build_parser(SPEC).epilog  # what `torchrun gpu_gates/NAME.py --help` prints
    assert f"{docs['SKIPPED']} skipped" in epilog and f"{docs['BAD_INPUT']} usage error" in epilog, epilog


def test_readme_and_gates_doc_link_to_the_table():
    for doc in ("README.md", os.path.join("docs", "gates.md")):
        text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
        assert "cli.md#exit-codes" in text, doc
