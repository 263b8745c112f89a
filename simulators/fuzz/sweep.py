"""A sweep: many seeds, one table of distinct findings, a minimized reproducer for each.

Output folder:

    results.json      every seed's result, sorted by seed (canonical JSON: the same bytes
                      whichever executor ran the seeds, in whatever order they ended); with
                      ``--explore K`` every run's, by seed then schedule seed (the fixed
                      order first), families marked (``simulators/fuzz/schedules.py``)
    signatures.txt    the table printed at the end
    minimized/        one scenario YAML per finding: ``rlharness simulate`` on it shows it
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional

import yaml

from harness.logs.writer import atomic_write
from harness.logs.expect import Expectation, from_signature, matches
from simulators.runtime.explore import ExploreSpec
from simulators.fuzz.executors import Job, Result, run_isolated, run_on_ray, seed_job
from simulators.fuzz.generate import scenario_mapping
from simulators.fuzz.minimize import minimize, signature_of
from simulators.fuzz.schedules import explore_flags, families, mark_families, run_key, schedule_only_lines
from simulators.fuzz.seed_run import divergence, fresh_hashes, run_id
from simulators.fuzz.signature import CLEAN


@dataclass
class SweepConfig:
    seeds: int
    start: int = 0
    workers: int = 2
    ray_address: Optional[str] = None
    out_dir: str = os.path.join("runs", "fuzz")
    check_determinism: bool = False
    time_budget_s: float = 120.0
    expect: List[Expectation] = field(default_factory=list)  # expected findings (the --baseline file)
    minimize_runs: int = 60  # candidate runs per minimization
    minimize_wall_s: float = 20.0  # wall seconds per minimization
    explore: int = 0  # schedule seeds per scenario seed (0..explore-1), beside the fixed order
    explore_strategy: str = "pct"
    upstream_as_findings: bool = False  # known upstream behaviour names a signature too

    def runs(self) -> List[Job]:
        """One job per run: each seed's fixed order, then its schedule seeds."""
        return [
            seed_job(s, None if k < 0 else ExploreSpec(k, self.explore_strategy), self.upstream_as_findings)
            for s in range(self.start, self.start + self.seeds)
            for k in range(-1, self.explore)
        ]


@dataclass
class Finding:
    signature: str
    count: int
    seeds: List[int]
    smallest_seed: int  # the seed with the smallest scenario (then the lowest seed)
    expected: bool
    minimized: Optional[str] = None  # path of the minimized scenario
    minimize_runs: int = 0
    explore: Optional[Dict[str, Any]] = None  # the smallest run's schedule (None: the fixed order)
    families: int = 0  # scenario seeds with this signature: runs differing only by schedule are one
    schedule_only: List[int] = field(default_factory=list)  # seeds whose fixed order ends otherwise
    scenario_file: Optional[str] = None  # explored sweeps: the smallest seed's scenario, when not minimized

    @property
    def reproducer(self) -> str:
        """The command that shows it: the minimized scenario (else the seed's own) under the
        smallest run's schedule."""
        path = self.minimized or self.scenario_file
        return f"rlharness simulate {path}{explore_flags(self.explore)}" if path else "-"


@dataclass
class SweepResult:
    results: List[Result]
    findings: List[Finding]
    wall_s: float
    not_found: List[Expectation] = field(default_factory=list)  # expectations no signature matched
    explore: int = 0  # schedule seeds per scenario seed
    explore_strategy: str = "pct"
    out_dir: str = ""

    def scenario_file(self, seed: int) -> str:
        """The scenario of ``seed``, written to the output folder (a reproducer's input)."""
        return _write_scenario(self.out_dir, seed)

    @property
    def unexpected(self) -> List[Finding]:
        return [f for f in self.findings if not f.expected]


def _is_expected(sig: str, expectations: Iterable[Expectation]) -> bool:
    """A signature read as a finding (harness.logs.expect.from_signature: its head is the
    check, its roles the pipeline types, its ``+`` suffixes the faults fired before it)."""
    found = from_signature(sig)
    return any(matches(e, found) for e in expectations)


def unmatched(findings: List[Finding], expectations: List[Expectation]) -> List[Expectation]:
    """Expectations that no signature of the sweep matched (``--strict`` fails on them)."""
    found = [from_signature(f.signature) for f in findings]
    return [e for e in expectations if not any(matches(e, f) for f in found)]


class Progress:
    """A live line on a terminal; a line every 10 s elsewhere (CI logs)."""

    def __init__(self, total: int, stream=sys.stderr) -> None:
        self.total, self.stream = total, stream
        self.tty = getattr(stream, "isatty", lambda: False)()
        self.t0 = time.monotonic()
        self.last = 0.0
        self.done = 0
        self.findings: Dict[str, int] = defaultdict(int)
        self.lost = 0

    def add(self, res: Result) -> None:
        self.done += 1
        if res["status"] in ("crashed", "timeout"):
            self.lost += 1
        if res["signature"] != CLEAN:
            self.findings[res["signature"]] += 1
        now = time.monotonic()
        if self.done == self.total or now - self.last >= (0.2 if self.tty else 10.0):
            self.last = now
            self._show(now)

    def _show(self, now: float) -> None:
        elapsed = now - self.t0
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        line = (
            f"[{self.done:>{len(str(self.total))}}/{self.total}] {len(self.findings)} signature(s), "
            f"{sum(self.findings.values())} finding(s), {self.lost} crashed/timeout, "
            f"{rate * 60:.0f} seeds/min, eta {eta:.0f} s"
        )
        if self.tty:
            self.stream.write("\r" + line + ("\n" if self.done == self.total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def say(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()


def _minimize_job(
    index: int,
    seed: int,
    sig: str,
    max_runs: int,
    wall_s: float,
    explore: Optional[Dict[str, Any]] = None,
    upstream_as_findings: bool = False,
) -> Result:
    """Shrink seed's scenario, every candidate under the finding's schedule seed (kept)."""
    spec = None if explore is None else ExploreSpec(explore["seed"], explore["strategy"])
    mapping, runs = minimize(
        scenario_mapping(seed),
        sig,
        max_runs=max_runs,
        wall_s=wall_s,
        signature_fn=lambda m: signature_of(m, spec, upstream_as_findings),
    )
    return {"seed": index, "mapping": mapping, "runs": runs}


def _slug(sig: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", sig).strip("_")[:60] or "finding"


def _findings(results: List[Result], expect: List[str]) -> List[Finding]:
    by_sig: Dict[str, List[Result]] = defaultdict(list)
    for r in results:
        if r["signature"] != CLEAN:
            by_sig[r["signature"]].append(r)
    out = []
    for sig, rs in by_sig.items():
        smallest = min(rs, key=lambda r: (r.get("scenario", {}).get("size", [1 << 30]), run_key(r)))
        n, only = families(rs)
        out.append(
            Finding(
                sig,
                len(rs),
                sorted({r["seed"] for r in rs}),
                smallest["seed"],
                _is_expected(sig, expect),
                explore=smallest.get("explore"),
                families=n,
                schedule_only=only,
            )
        )
    return sorted(out, key=lambda f: (-f.count, f.signature))


def _execute(jobs: List[Job], cfg: SweepConfig, budget: float) -> Iterable[Result]:
    if cfg.ray_address is not None:
        return run_on_ray(jobs, address=cfg.ray_address, workers=cfg.workers, budget=budget)
    return run_isolated(jobs, workers=cfg.workers, budget=budget, clock=time.monotonic)


_CHUNK = 10  # seeds per fresh interpreter in the determinism pass


def _check_determinism(results: List[Result], cfg: SweepConfig, progress: Optional[Progress]) -> None:
    """Each seed again in fresh interpreters under another PYTHONHASHSEED (a chunk of seeds
    per interpreter: one start-up per chunk, not per seed); where a log hash differs,
    locate the first divergent record. Adds ``determinism`` to every result."""
    ran = [r for r in results if "log_sha256" in r]
    for r in results:
        if "log_sha256" not in r:
            r["determinism"] = {"status": "not_checked", "why": f"the run {r['status']}"}
    if progress is not None:
        progress.say(f"checking determinism of {len(ran)} seed(s) in fresh processes ...")
    runs = [run_id(r["seed"], r.get("explore")) for r in ran]
    chunks = [runs[i : i + _CHUNK] for i in range(0, len(runs), _CHUNK)]
    budget = cfg.time_budget_s * _CHUNK
    jobs = [Job(i, fresh_hashes, (c, budget, i)) for i, c in enumerate(chunks)]
    fresh: Dict[str, str] = {}
    why: Dict[str, str] = {}
    for res in _execute(jobs, cfg, budget + 10.0):
        if "hashes" in res:
            fresh.update(res["hashes"])
        else:
            why.update({rid: res.get("error") or res.get("detail", res["status"]) for rid in chunks[res["seed"]]})
    for r, rid in zip(ran, runs):
        if rid in why:
            r["determinism"] = {"status": "not_checked", "why": why[rid]}
        elif fresh.get(rid) == r["log_sha256"]:
            r["determinism"] = {"status": "identical"}
        else:
            r["determinism"] = divergence(r["seed"], cfg.time_budget_s, r.get("explore"))
            r["status"], r["signature"] = "finding", "nondeterministic"


def results_json(results: List[Result]) -> str:
    return json.dumps(sorted(results, key=run_key), sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def run_sweep(cfg: SweepConfig, progress: Optional[Progress] = None, minimize_findings: bool = True) -> SweepResult:
    t0 = time.monotonic()
    results: List[Result] = []
    for res in _execute(cfg.runs(), cfg, cfg.time_budget_s):
        results.append(res)
        if progress is not None:
            progress.add(res)
    results.sort(key=run_key)
    if cfg.check_determinism:
        _check_determinism(results, cfg, progress)
    if cfg.explore:
        mark_families(results)
    findings = _findings(results, cfg.expect)
    # a seed that crashed or ran out of time is reported as it is: shrinking it would
    # crash or hang again, once per candidate
    to_minimize = [f for f in findings if f.signature != "timeout" and not f.signature.startswith("crashed:")]
    if minimize_findings and to_minimize:
        if progress is not None:
            progress.say(f"minimizing {len(to_minimize)} finding(s) ...")
        jobs = [
            Job(
                i,
                _minimize_job,
                (
                    i,
                    f.smallest_seed,
                    f.signature,
                    cfg.minimize_runs,
                    cfg.minimize_wall_s,
                    f.explore,
                    cfg.upstream_as_findings,
                ),
            )
            for i, f in enumerate(to_minimize)
        ]
        budget = cfg.minimize_wall_s + cfg.time_budget_s  # the last candidate may start just in time
        for res in run_isolated(jobs, workers=cfg.workers, budget=budget, clock=time.monotonic):
            f = to_minimize[res["seed"]]
            if "mapping" in res:
                f.minimized = _write_minimized(cfg.out_dir, f, res["mapping"])
                f.minimize_runs = res["runs"]
    if cfg.explore:  # every finding of an explored sweep names a file to run with its schedule
        for f in findings:
            if f.minimized is None and f.signature != "timeout" and not f.signature.startswith("crashed"):
                f.scenario_file = _write_scenario(cfg.out_dir, f.smallest_seed)
    return SweepResult(
        results,
        findings,
        time.monotonic() - t0,
        unmatched(findings, cfg.expect),
        cfg.explore,
        cfg.explore_strategy,
        cfg.out_dir,
    )


def _write_scenario(out_dir: str, seed: int) -> str:
    path = os.path.join(out_dir, "scenarios", f"seed{seed}.yaml")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(
        path,
        f"# The scenario of fuzz seed {seed} (not minimized).\n"
        + yaml.safe_dump(scenario_mapping(seed), sort_keys=False),
    )
    return path


def _write_minimized(out_dir: str, f: Finding, mapping: Dict[str, Any]) -> str:
    flags = explore_flags(f.explore)
    schedule = f" schedule seed {f.explore['seed']} ({f.explore['strategy']})" if f.explore else ""
    name = f"seed{f.smallest_seed}" + (f"_x{f.explore['seed']}{f.explore['strategy']}" if f.explore else "")
    path = os.path.join(out_dir, "minimized", f"{name}_{_slug(f.signature)}.yaml")
    mapping = dict(
        mapping,
        name=f"min_{_slug(f.signature)}"[:60],
        description=f"minimized by rlharness fuzz from seed {f.smallest_seed}{schedule}: {f.signature}",
    )
    head = (
        f"# Minimized reproducer of '{f.signature}' (rlharness fuzz, seed {f.smallest_seed}{schedule}).\n"
        f"# See it: rlharness simulate {path}{flags}\n"
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(path, head + yaml.safe_dump(mapping, sort_keys=False))
    return path


def format_table(sweep: SweepResult) -> str:
    results = sweep.results
    lines = _explored_table(sweep) if sweep.explore else _table(sweep)
    for e in sweep.not_found:
        lines.append(f"  expected, not found: {e.label()} ({e.source}): {e.reason}")
    lines += _known_lines(results)
    dets = [r.get("determinism", {}).get("status") for r in results]
    if any(d is not None for d in dets):
        lines.append(
            f"determinism: {dets.count('identical')} identical, {dets.count('diverged')} diverged, "
            f"{dets.count('not_checked')} not checked (fresh process failed)"
        )
    return "\n".join(lines)


def _known_lines(results: List[Result]) -> List[str]:
    """One line per known upstream behaviour the seeds hit (no signature: harness.logs.known_upstream)."""
    from harness.logs.known_upstream import BY_NAME

    seeds: Dict[str, List[int]] = {}
    for r in results:
        for name in r.get("known_upstream") or {}:
            seeds.setdefault(name, []).append(r["seed"])
    return [
        f"  known upstream  {BY_NAME[name].check} in {len(ss)} seed(s) (first {min(ss)}): {BY_NAME[name].what} "
        f"[{BY_NAME[name].source}]"
        for name, ss in sorted(seeds.items())
    ]


def _table(sweep: SweepResult) -> List[str]:
    results = sweep.results
    clean = sum(1 for r in results if r["signature"] == CLEAN)
    lines = [
        f"{len(results)} seeds in {sweep.wall_s:.1f} s: {clean} clean, "
        f"{len(results) - clean} with a finding, {len(sweep.findings)} distinct signature(s)"
    ]
    if sweep.findings:
        width = max(len(f.signature) for f in sweep.findings)
        lines.append(f"  {'signature':<{width}}  count  smallest seed  expected  minimized reproducer")
        for f in sweep.findings:
            lines.append(
                f"  {f.signature:<{width}}  {f.count:>5}  {f.smallest_seed:>13}  "
                f"{'yes' if f.expected else 'NO':>8}  {f.minimized or '-'}"
            )
    return lines


def _explored_table(sweep: SweepResult) -> List[str]:
    """Runs, then one row per signature: its runs, its families (one per scenario seed: runs
    that differ only by schedule), how many of those only a schedule reaches, and the
    command that shows it (``--explore SEED --explore-strategy S`` included)."""
    results, findings = sweep.results, sweep.findings
    seeds = len({r["seed"] for r in results})
    clean = sum(1 for r in results if r["signature"] == CLEAN)
    only = sum(len(f.schedule_only) for f in findings)
    lines = [
        f"{seeds} seeds x (fixed order + {sweep.explore} {sweep.explore_strategy} schedule seed(s)) = "
        f"{len(results)} runs in {sweep.wall_s:.1f} s: {clean} clean, {len(results) - clean} with a finding, "
        f"{len(findings)} distinct signature(s) in {sum(f.families for f in findings)} family(ies), "
        f"{only} schedule-only"
    ]
    if findings:
        width = max(len(f.signature) for f in findings)
        lines.append(f"  {'signature':<{width}}   runs  families  schedule-only  smallest run  expected  reproducer")
        for f in findings:
            run = f"{f.smallest_seed}" + (f" x{f.explore['seed']}" if f.explore else "")
            lines.append(
                f"  {f.signature:<{width}}  {f.count:>5}  {f.families:>8}  {len(f.schedule_only):>13}  "
                f"{run:>12}  {'yes' if f.expected else 'NO':>8}  {f.reproducer}"
            )
    return lines + schedule_only_lines(findings, results, sweep.scenario_file)
