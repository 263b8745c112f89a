"""A sweep: many seeds, one table of distinct findings, a minimized reproducer for each.

Output folder:

    results.json      every seed's result, sorted by seed (canonical JSON: the same bytes
                      whichever executor ran the seeds, in whatever order they ended)
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
from typing import Any, Callable, Dict, Iterable, List, Optional

import yaml

from harness.eventlog.writer import atomic_write
from harness.expect import Expectation, from_signature, matches
from simulators.fuzz.executors import Job, Result, run_isolated, run_on_ray, seed_job
from simulators.fuzz.generate import scenario_mapping
from simulators.fuzz.minimize import minimize
from simulators.fuzz.seed_run import divergence, fresh_hashes
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


@dataclass
class Finding:
    signature: str
    count: int
    seeds: List[int]
    smallest_seed: int  # the seed with the smallest scenario (then the lowest seed)
    expected: bool
    minimized: Optional[str] = None  # path of the minimized scenario
    minimize_runs: int = 0


@dataclass
class SweepResult:
    results: List[Result]
    findings: List[Finding]
    wall_s: float
    not_found: List[Expectation] = field(default_factory=list)  # expectations no signature matched

    @property
    def unexpected(self) -> List[Finding]:
        return [f for f in self.findings if not f.expected]


def _is_expected(sig: str, expectations: Iterable[Expectation]) -> bool:
    """A signature read as a finding (harness.expect.from_signature: its head is the
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
        line = (f"[{self.done:>{len(str(self.total))}}/{self.total}] {len(self.findings)} signature(s), "
                f"{sum(self.findings.values())} finding(s), {self.lost} crashed/timeout, "
                f"{rate * 60:.0f} seeds/min, eta {eta:.0f} s")
        if self.tty:
            self.stream.write("\r" + line + ("\n" if self.done == self.total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def say(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()


def _minimize_job(seed: int, sig: str, max_runs: int, wall_s: float) -> Result:
    mapping, runs = minimize(scenario_mapping(seed), sig, max_runs=max_runs, wall_s=wall_s)
    return {"seed": seed, "mapping": mapping, "runs": runs}


def _slug(sig: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", sig).strip("_")[:60] or "finding"


def _findings(results: List[Result], expect: List[str]) -> List[Finding]:
    by_sig: Dict[str, List[Result]] = defaultdict(list)
    for r in results:
        if r["signature"] != CLEAN:
            by_sig[r["signature"]].append(r)
    out = []
    for sig, rs in by_sig.items():
        smallest = min(rs, key=lambda r: (r.get("scenario", {}).get("size", [1 << 30]), r["seed"]))
        out.append(Finding(sig, len(rs), sorted(r["seed"] for r in rs), smallest["seed"], _is_expected(sig, expect)))
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
    seeds = [r["seed"] for r in ran]
    chunks = [seeds[i:i + _CHUNK] for i in range(0, len(seeds), _CHUNK)]
    budget = cfg.time_budget_s * _CHUNK
    jobs = [Job(c[0], fresh_hashes, (c, budget)) for c in chunks]
    fresh: Dict[int, str] = {}
    why: Dict[int, str] = {}
    for res, chunk in _zip_chunks(_execute(jobs, cfg, budget + 10.0), chunks):
        if "hashes" in res:
            fresh.update(res["hashes"])
        else:
            why.update({s: res.get("error") or res.get("detail", res["status"]) for s in chunk})
    for r in ran:
        seed = r["seed"]
        if seed in why:
            r["determinism"] = {"status": "not_checked", "why": why[seed]}
        elif fresh.get(seed) == r["log_sha256"]:
            r["determinism"] = {"status": "identical"}
        else:
            r["determinism"] = divergence(seed, cfg.time_budget_s)
            r["status"], r["signature"] = "finding", "nondeterministic"


def _zip_chunks(results: Iterable[Result], chunks: List[List[int]]):
    by_first = {c[0]: c for c in chunks}
    for res in results:
        yield res, by_first[res["seed"]]


def results_json(results: List[Result]) -> str:
    return json.dumps(sorted(results, key=lambda r: r["seed"]), sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def run_sweep(cfg: SweepConfig, progress: Optional[Progress] = None,
              minimize_findings: bool = True) -> SweepResult:
    t0 = time.monotonic()
    seeds = range(cfg.start, cfg.start + cfg.seeds)
    results: List[Result] = []
    for res in _execute([seed_job(s) for s in seeds], cfg, cfg.time_budget_s):
        results.append(res)
        if progress is not None:
            progress.add(res)
    results.sort(key=lambda r: r["seed"])
    if cfg.check_determinism:
        _check_determinism(results, cfg, progress)
    findings = _findings(results, cfg.expect)
    # a seed that crashed or ran out of time is reported as it is: shrinking it would
    # crash or hang again, once per candidate
    to_minimize = [f for f in findings if f.signature != "timeout" and not f.signature.startswith("crashed:")]
    if minimize_findings and to_minimize:
        if progress is not None:
            progress.say(f"minimizing {len(to_minimize)} finding(s) ...")
        jobs = [Job(f.smallest_seed, _minimize_job, (f.smallest_seed, f.signature, cfg.minimize_runs, cfg.minimize_wall_s)) for f in to_minimize]
        by_seed = {f.smallest_seed: f for f in to_minimize}
        budget = cfg.minimize_wall_s + cfg.time_budget_s  # the last candidate may start just in time
        for res in run_isolated(jobs, workers=cfg.workers, budget=budget, clock=time.monotonic):
            f = by_seed[res["seed"]]
            if "mapping" in res:
                f.minimized = _write_minimized(cfg.out_dir, f, res["mapping"])
                f.minimize_runs = res["runs"]
    return SweepResult(results, findings, time.monotonic() - t0, unmatched(findings, cfg.expect))


def _write_minimized(out_dir: str, f: Finding, mapping: Dict[str, Any]) -> str:
    path = os.path.join(out_dir, "minimized", f"seed{f.smallest_seed}_{_slug(f.signature)}.yaml")
    mapping = dict(mapping, name=f"min_{_slug(f.signature)}"[:60],
                   description=f"minimized by rlharness fuzz from seed {f.smallest_seed}: {f.signature}")
    head = (f"# Minimized reproducer of '{f.signature}' (rlharness fuzz, seed {f.smallest_seed}).\n"
            f"# See it: rlharness simulate {path}\n")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(path, head + yaml.safe_dump(mapping, sort_keys=False))
    return path


def format_table(sweep: SweepResult) -> str:
    results = sweep.results
    clean = sum(1 for r in results if r["signature"] == CLEAN)
    lines = [f"{len(results)} seeds in {sweep.wall_s:.1f} s: {clean} clean, "
             f"{len(results) - clean} with a finding, {len(sweep.findings)} distinct signature(s)"]
    if sweep.findings:
        width = max(len(f.signature) for f in sweep.findings)
        lines.append(f"  {'signature':<{width}}  count  smallest seed  expected  minimized reproducer")
        for f in sweep.findings:
            lines.append(f"  {f.signature:<{width}}  {f.count:>5}  {f.smallest_seed:>13}  "
                         f"{'yes' if f.expected else 'NO':>8}  {f.minimized or '-'}")
    for e in sweep.not_found:
        lines.append(f"  expected, not found: {e.label()} ({e.source}): {e.reason}")
    dets = [r.get("determinism", {}).get("status") for r in results]
    if any(d is not None for d in dets):
        lines.append(f"determinism: {dets.count('identical')} identical, {dets.count('diverged')} diverged, "
                     f"{dets.count('not_checked')} not checked (fresh process failed)")
    return "\n".join(lines)
