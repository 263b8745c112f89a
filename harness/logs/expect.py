"""Expected findings, the pytest ``xfail`` way: one vocabulary for every command.

A CI run must mean "something new is wrong" when it is red. A scenario (or a whole
project) has findings that are known and understood — a hazard of the modelled system
that the scenario exists to show, a by-design memory residue — and those should not turn
every run red. An *expectation* names such a finding and says why it is expected::

    {check: handover, pipeline: big7b, reason: "NeMo's init keeps its Megatron groups"}

It lives in a scenario's ``expect:`` list or in a *baseline file* (``expect:`` at its top
level, read by ``simulate``, ``check``, ``replay`` and ``fuzz`` alike). Verdict rules:

* a finding matched by an expectation is *expected*: reported, not a failure;
* any other finding is *unexpected*: exit 1, as before;
* an expectation that matched nothing is reported as *expected, not found*; under
  ``--strict`` it fails the run (``xfail(strict=True)``: the known finding vanished,
  so the expectation is stale or the finding moved).

A finding is what the oracle or the run reported, reduced to what an expectation can
name: its check (an oracle check name, or for a run that ended badly ``oom:<mem>``,
``timeout:<what>``, ``horizon:never_trained`` ... as in fuzz signatures), the pipelines
and clusters its message names (pipeline types too where the scenario is known), and the
faults that fired before it. Fields of an expectation are ``*``/``?`` globs; an absent
field matches anything. Clock-free and I/O-free: files are read by the callers.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

#: keys of one expectation; ``check`` and ``reason`` are required
FIELDS = ("check", "pipeline", "cluster", "after_fault", "reason")
#: run-ending outcomes an expectation may name besides the oracle's checks (``oom:weights``)
OUTCOME_PREFIXES = ("oom:", "timeout:", "plan_validation:", "scheduler_failed:", "failed:", "horizon:", "crashed:")
OUTCOME_NAMES = ("timeout", "nondeterministic")


@dataclass(frozen=True)
class Expectation:
    check: str
    reason: str
    pipeline: Optional[str] = None
    cluster: Optional[str] = None
    after_fault: Optional[str] = None
    source: str = ""  # where it was written (scenario / baseline file and index): shown in reports
    message: Optional[str] = None  # a glob on the finding's message (the built-in list's entries only)
    known: str = ""  # the name of a known upstream behaviour (harness.logs.known_upstream): never "not found"

    def label(self) -> str:
        scope = "".join(f" {k}={getattr(self, k)}" for k in ("pipeline", "cluster", "after_fault") if getattr(self, k))
        return f"{self.check}{scope}"

    def as_mapping(self) -> Dict[str, str]:
        return {k: getattr(self, k) for k in FIELDS if getattr(self, k) is not None}


@dataclass(frozen=True)
class Finding:
    check: str
    message: str = ""
    seq: int = -1
    pipelines: Tuple[str, ...] = ()  # names (and types, where known) the finding names
    clusters: Tuple[str, ...] = ()
    faults: Tuple[str, ...] = ()  # faults that fired before it

    def __str__(self) -> str:
        return f"[{self.check}] seq {self.seq}: {self.message}" if self.message else self.check


@dataclass
class Verdict:
    expected: List[Tuple[Finding, Expectation]] = field(default_factory=list)
    unexpected: List[Finding] = field(default_factory=list)
    not_found: List[Expectation] = field(default_factory=list)
    expectations: int = 0  # how many the user gave (scenario, baseline); the built-in list is not counted

    @property
    def reported(self) -> bool:
        """Whether the verdict has lines of its own: expectations were given, or a known
        upstream behaviour was hit (otherwise the report is the plain violation list)."""
        return bool(self.expectations) or any(e.known for _, e in self.expected)

    def known_hits(self) -> Dict[str, List[Finding]]:
        """Findings of each known upstream behaviour hit, by its name (in first-hit order)."""
        out: Dict[str, List[Finding]] = {}
        for f, e in self.expected:
            if e.known:
                out.setdefault(e.known, []).append(f)
        return out

    def failed(self, strict: bool = False) -> bool:
        return bool(self.unexpected) or (strict and bool(self.not_found))

    def as_json(self) -> Dict[str, Any]:
        """summary.json's ``findings`` block: expected (grouped by expectation), unexpected, not found."""
        groups: Dict[int, Dict[str, Any]] = {}
        for f, e in self.expected:
            g = groups.setdefault(id(e), {**e.as_mapping(), "count": 0, "first_seq": f.seq})
            if e.known:  # the built-in list's: its name and upstream source
                g.update(known_upstream=e.known, source=_known_source(e.known))
            g["count"] += 1
        return {
            "expected": list(groups.values()),
            "unexpected": [{"check": f.check, "seq": f.seq, "message": f.message} for f in self.unexpected],
            "expected_not_found": [e.as_mapping() for e in self.not_found],
        }


def _known_source(name: str) -> str:
    from harness.logs.known_upstream import BY_NAME  # (it imports this module)

    return BY_NAME[name].source


def _glob(pattern: Optional[str], values: Iterable[str]) -> bool:
    """``*`` and ``?`` are wildcards, everything else literal (``[`` too)."""
    if pattern is None:
        return True
    pat = pattern.replace("[", "[[]")
    return any(fnmatch.fnmatchcase(v, pat) for v in values)


def matches(e: Expectation, f: Finding) -> bool:
    return (
        _glob(e.check, (f.check,))
        and _glob(e.pipeline, f.pipelines)
        and _glob(e.cluster, f.clusters)
        and _glob(e.after_fault, f.faults)
        and _glob(e.message, (f.message,))
    )


def classify(findings: Sequence[Finding], expectations: Sequence[Expectation]) -> Verdict:
    """Each finding against the expectations in order (the first match claims it)."""
    v = Verdict(expectations=sum(1 for e in expectations if not e.known))
    used = set()
    for f in findings:
        for i, e in enumerate(expectations):
            if matches(e, f):
                v.expected.append((f, e))
                used.add(i)
                break
        else:
            v.unexpected.append(f)
    # a known upstream behaviour is a property of the modelled system: not hitting it is no news
    v.not_found = [e for i, e in enumerate(expectations) if i not in used and not e.known]
    return v


# ----------------------------------------------------------------------------- findings


_AFTER_NAME = r"(?=$|[^\w-]|_actor_|_critic|_reference|_reward)"


@lru_cache(maxsize=4096)
def _name_pattern(name: str) -> "re.Pattern[str]":
    return re.compile(rf"(?<![\w-]){re.escape(name)}{_AFTER_NAME}")


def named_in(text: str, names: Iterable[str]) -> List[str]:
    """Names that occur in a text as whole words (a pipeline name also heads its cluster
    ids ``p0_actor_train`` and owners ``p0/dp1``). The plain substring test first: a
    1024-GPU run's 25 thousand findings against its 100 names spent 7 s in the regex."""
    return _NameMatcher(names)(text)


class _NameMatcher:
    """:func:`named_in` against one set of names, for many texts: the names are sorted
    and their patterns found once (the answer is then sorted as it is built)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = [(n, _name_pattern(n).search) for n in sorted(set(names))]

    def __call__(self, text: str) -> List[str]:
        return [n for n, search in self.names if n in text and search(text)]


def log_names(records: Iterable[Mapping[str, Any]]) -> Tuple[List[str], List[str]]:
    """(pipeline names, cluster ids) the log registers."""
    pipes: Set[str] = set()
    clusters: Set[str] = set()
    for r in records:
        if r.get("kind") == "register":
            pid = r.get("pipeline_id")
            if isinstance(pid, str):
                pipes.add(pid)
                clusters.update(f"{pid}_{c}" for c in (r.get("cluster_device_mappings") or {}))
    return sorted(pipes), sorted(clusters)


def log_types(records: Sequence[Mapping[str, Any]]) -> Dict[str, str]:
    """Pipeline name -> type, as the log's header records them (``meta.pipeline_types``,
    written by the simulator); ``{}`` for a log that does not (a gate's, an imported one):
    there an expectation's ``pipeline`` matches names only."""
    head = records[0] if records else {}
    types = (head.get("meta") or {}).get("pipeline_types") if head.get("kind") == "header" else None
    return {str(k): str(v) for k, v in types.items()} if isinstance(types, Mapping) else {}


def from_violations(
    violations: Iterable[Any],
    records: Sequence[Mapping[str, Any]],
    types: Optional[Mapping[str, str]] = None,
    of: Optional[Callable[[str], Sequence[Mapping[str, Any]]]] = None,
) -> List[Finding]:
    """The oracle's violations as findings: the pipelines (and their types, when
    ``types`` maps names to types) and clusters each message names, the faults fired
    before it. ``of(kind)``, when the caller has an index of the log by kind (a
    :class:`harness.logs.outputs.run_view.RunView`'s ``of``), gives the records of one kind in
    log order: the ``register`` and ``fault_fired`` records without two walks of a
    million-record log."""
    violations = list(violations)
    if not violations:
        return []
    pipes, clusters = log_names(records if of is None else of("register"))
    types = dict(types if types is not None else log_types(records))
    in_pipes, in_clusters = _NameMatcher(set(pipes) | set(types)), _NameMatcher(clusters)
    fired = [
        (r["seq"], r["name"]) for r in (records if of is None else of("fault_fired")) if r.get("kind") == "fault_fired"
    ]
    out = []
    for v in violations:
        names = in_pipes(v.message)
        out.append(
            Finding(
                v.invariant,
                v.message,
                v.seq,
                tuple(names + sorted({types[n] for n in names if n in types})),
                tuple(in_clusters(v.message)),
                tuple(sorted({n for s, n in fired if s <= v.seq})),
            )
        )
    return out


def from_signature(sig: str) -> Finding:
    """A fuzz signature (``handover[nemo_async] +keep_nccl_on_sleep``) as a finding: its
    roles are pipeline types, its ``+`` suffixes the faults fired before it."""
    head, *faults = sig.split(" +")
    m = re.fullmatch(r"(.*?)\[([\w,-]*)\]", head)
    check, roles = (m.group(1), tuple(r for r in m.group(2).split(",") if r)) if m else (head, ())
    return Finding(check, sig, -1, roles, (), tuple(faults))


# ----------------------------------------------------------------------------- parsing


def _known_check(name: str, checks: Iterable[str]) -> bool:
    if any(c in name for c in "*?"):
        return True
    return name in set(checks) or name in OUTCOME_NAMES or name.startswith(OUTCOME_PREFIXES)


def parse_expectations(
    raw: Any,
    path: str,
    fail: Callable[[str, str], Exception],
    checks: Iterable[str],
    source: str = "",
    pipelines: Optional[Iterable[str]] = None,
    faults: Optional[Iterable[str]] = None,
) -> List[Expectation]:
    """A validated ``expect:`` list. ``fail(field_path, problem)`` makes the one-line
    error the caller raises (the scenario loader's, or the baseline reader's). Where the
    scenario is known (``pipelines``: its names and types; ``faults``: the fault names),
    a ``pipeline`` or ``after_fault`` written without a wildcard must exist, so a typo is
    an error rather than an expectation that silently never matches."""
    checks = list(checks)
    if not isinstance(raw, list):
        raise fail(path, "expected a list of {check, reason, pipeline|cluster|after_fault} mappings")
    out = []
    for i, item in enumerate(raw):
        where = f"{path}[{i}]"
        if not isinstance(item, Mapping):
            raise fail(where, "expected a mapping with check and reason")
        for key in item:
            if key not in FIELDS:
                raise fail(f"{where}.{key}", f"unknown field; known: {', '.join(FIELDS)}")
        for key in ("check", "reason"):
            if key not in item:
                raise fail(
                    f"{where}.{key}",
                    "missing (required: say why this finding is expected)" if key == "reason" else "missing (required)",
                )
        for key, value in item.items():
            if not isinstance(value, str) or not value.strip():
                raise fail(f"{where}.{key}", "expected a non-empty string")
        if not _known_check(item["check"], checks):
            raise fail(
                f"{where}.check",
                f"unknown check {item['check']!r}; known: {', '.join(sorted(checks))}, "
                f"or an outcome ({', '.join(p + '*' for p in OUTCOME_PREFIXES)})",
            )
        _check_refs(item, where, fail, pipelines, faults)
        out.append(
            Expectation(
                item["check"],
                " ".join(item["reason"].split()),
                item.get("pipeline"),
                item.get("cluster"),
                item.get("after_fault"),
                source=f"{source}{where}",
            )
        )
    return out


def _check_refs(
    item: Mapping[str, str],
    where: str,
    fail: Callable[[str, str], Exception],
    pipelines: Optional[Iterable[str]],
    faults: Optional[Iterable[str]],
) -> None:
    for key, known, what in (("pipeline", pipelines, "pipeline or pipeline type"), ("after_fault", faults, "fault")):
        value = item.get(key)
        if value is None or known is None or any(c in value for c in "*?"):
            continue
        known = sorted(set(known))
        if value not in known:
            raise fail(f"{where}.{key}", f"no {what} {value!r}; known: {', '.join(known)}")


# ----------------------------------------------------------------------------- reports


def report_lines(v: Verdict, strict: bool = False, shown: int = 20) -> List[str]:
    """Expected findings grouped by their expectation, then each unexpected finding,
    then the expectations that matched nothing (a failure under ``--strict``)."""
    lines: List[str] = []
    if not v.reported:
        return lines
    counts: Dict[int, List[Any]] = {}
    for f, e in v.expected:
        if not e.known:
            counts.setdefault(id(e), [e, 0])[1] += 1
    known = v.known_hits()
    n_known = sum(len(fs) for fs in known.values())
    lines.append(
        f"findings: {len(v.unexpected)} unexpected, {len(v.expected) - n_known} expected"
        + (f", {n_known} known upstream behaviour" if known else "")
        + (f", {len(v.not_found)} expected but not found" if v.not_found else "")
    )
    for e, n in counts.values():
        lines.append(f"  expected    {e.label()} x{n}: {e.reason}")
    if known:
        from harness.logs.known_upstream import behaviour_line  # (it imports this module)

        lines += [behaviour_line(name, fs) for name, fs in known.items()]
    for f in v.unexpected[:shown]:
        lines.append(f"  UNEXPECTED  {f}")
    if len(v.unexpected) > shown:
        lines.append(f"  ... and {len(v.unexpected) - shown} more unexpected finding(s)")
    for e in v.not_found:
        lines.append(
            f"  {'NOT FOUND' if strict else 'not found'}   {e.label()} ({e.source}): expected, did not occur"
            + (" (--strict: a failure)" if strict else "")
        )
    return lines


def baseline_entries(findings: Sequence[Finding], origin: str) -> List[Dict[str, str]]:
    """``--write-baseline``: one expectation per (check, pipelines named) found, in order
    of first appearance; the reason says where it came from, for the author to replace."""
    seen: Dict[Tuple[str, Tuple[str, ...]], Dict[str, str]] = {}
    for f in findings:
        key = (f.check, f.pipelines[:1])
        if key not in seen:
            entry = {"check": f.check}
            if f.pipelines:
                entry["pipeline"] = f.pipelines[0]
            entry["reason"] = f"found in {origin} when this baseline was written (replace with why it is expected)"
            seen[key] = entry
    return list(seen.values())
