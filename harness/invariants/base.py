"""Invariant plumbing: a violation type and the registry every check joins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence

Records = Sequence[dict]


@dataclass(frozen=True)
class Violation:
    invariant: str
    seq: int
    message: str

    def __str__(self) -> str:
        return f"[{self.invariant}] seq {self.seq}: {self.message}"


CHECKS: Dict[str, Callable[[Records], List[Violation]]] = {}


def invariant(name: str):
    """Register a check under a stable name (used in reports and ``--check`` filters)."""

    def wrap(fn: Callable[[Records], List[Violation]]):
        CHECKS[name] = fn
        fn.invariant_name = name  # type: ignore[attr-defined]
        return fn

    return wrap


def effects(records: Records, kind: str, name: str):
    """Effect records of one effect name, in log order."""
    return [r for r in records if r["kind"] == kind and r["effect"] == name]
