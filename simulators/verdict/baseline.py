"""Baseline files: the expected findings of a project, one format for every command.

``rlharness simulate|check|replay|fuzz --baseline FILE`` read it; ``rlharness check
--write-baseline FILE`` writes today's findings to start from (docs/expected-findings.md)::

    # why each entry is expected goes in its reason
    expect:
      - {check: handover, pipeline: nemo_async, reason: "NeMo's init keeps its Megatron groups"}
      - {check: "*", after_fault: wake_before_offload, reason: "the fault's own effect"}

The entries are those of a scenario's ``expect:`` list (:mod:`harness.logs.expect`). A bad
file is bad input: one line naming the file and the field, exit 2, before any work.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import yaml

from harness.logs.expect import Expectation, Finding, baseline_entries, parse_expectations
from harness.logs.invariants import CHECKS

HEADER = (
    "# Expected findings (rlharness baseline; docs/expected-findings.md). Written by\n"
    "# `rlharness check --write-baseline`: replace each reason with why the finding is expected.\n"
)


class BaselineError(ValueError):
    pass


def read_baseline(path: Optional[str], flag: str = "--baseline") -> List[Expectation]:
    """The expectations of a baseline file (``[]`` for ``None``)."""
    if path is None:
        return []
    from simulators.scenario.yaml_dialect import strict_safe_load

    def fail(where: str, problem: str) -> BaselineError:
        return BaselineError(f"{flag}: {path}: {where}: {problem}")

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as e:
        raise BaselineError(f"{flag}: {path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    try:
        data = strict_safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "(file)"
        raise fail(where, f"malformed YAML: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(data, dict) or "expect" not in data:
        raise fail("(top level)", "expected a mapping with an 'expect' list (docs/expected-findings.md)")
    extra = sorted(set(data) - {"expect"})
    if extra:
        raise fail(str(extra[0]), "unknown field; a baseline holds only 'expect'")
    return parse_expectations(data["expect"], "expect", fail, CHECKS, source=f"{path}: ")


def baseline_text(findings: Sequence[Finding], origin: str) -> str:
    return HEADER + yaml.safe_dump({"expect": baseline_entries(findings, origin)}, sort_keys=False, width=1000)
