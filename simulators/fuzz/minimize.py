"""Shrink a scenario while its finding still reproduces: the smallest reproducer.

Greedy delta debugging over the scenario file's mapping (the form a user reads and
edits): try one simplification at a time — drop a pipeline, drop a fault, drop a DP
rank, fewer steps, a smaller workload, a smaller model, no start delay, default costs
and scheduler options, fewer GPUs — keep it if the run still has the same signature,
and start over until no simplification keeps it or the run budget is spent. Every
candidate goes through the scenario loader, so an invalid simplification is skipped,
never run.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from simulators.fuzz.seed_run import run_scenario
from simulators.scenario.loader import ScenarioError, scenario_from_mapping

Mapping = Dict[str, Any]


def _tidy(m: Mapping) -> Mapping:
    if not m.get("faults", True):
        del m["faults"]
    return m


def _drop_pipeline(m: Mapping) -> Iterator[Mapping]:
    if len(m["pipelines"]) < 2:
        return
    for i in range(len(m["pipelines"])):
        c = copy.deepcopy(m)
        name = c["pipelines"].pop(i)["name"]
        c["faults"] = [f for f in c.get("faults", []) if f["pipeline"] != name]
        yield _tidy(c)


def _drop_fault(m: Mapping) -> Iterator[Mapping]:
    for i in range(len(m.get("faults", []))):
        c = copy.deepcopy(m)
        c["faults"].pop(i)
        yield _tidy(c)


def _drop_rank(m: Mapping) -> Iterator[Mapping]:
    """One TP bundle less in a pipeline's infer mapping (and out of its train mapping)."""
    for i, p in enumerate(m["pipelines"]):
        tp = p.get("infer_tp", 1)
        infer = sorted(p["infer_gpus"])
        for r in range(len(infer) // tp):
            bundle = set(infer[r * tp : (r + 1) * tp])
            train = [g for g in p["train_gpus"] if g not in bundle]
            if not train:
                continue
            c = copy.deepcopy(m)
            c["pipelines"][i]["infer_gpus"] = [g for g in infer if g not in bundle]
            c["pipelines"][i]["train_gpus"] = train
            yield c


def _fewer_steps(m: Mapping) -> Iterator[Mapping]:
    for i, p in enumerate(m["pipelines"]):
        floor = 1 + max([f.get("at_step", 0) for f in m.get("faults", []) if f["pipeline"] == p["name"]], default=0)
        for steps in sorted({floor, p["steps"] - 1}):
            if floor <= steps < p["steps"]:
                c = copy.deepcopy(m)
                c["pipelines"][i]["steps"] = steps
                yield c


def _set(m: Mapping, i: int, section: str, key: str, value: Any) -> Optional[Mapping]:
    p = m["pipelines"][i]
    if p.get(section, {}).get(key) in (None, value):
        return None
    c = copy.deepcopy(m)
    c["pipelines"][i][section][key] = value
    return c


def _smaller_pipelines(m: Mapping) -> Iterator[Mapping]:
    for i, p in enumerate(m["pipelines"]):
        for section, key, value in (
            ("workload", "prompts_per_step", 1),
            ("workload", "generations_per_prompt", 1),
            ("workload", "decode_tokens_median", 64.0),
            ("workload", "decode_tokens_sigma", 0.3),
            ("model", "params", 5e8),
        ):
            c = _set(m, i, section, key, value)
            if c is not None:
                yield c
        for key, value in (("start_s", 0.0), ("sleep_level", 2), ("infer_tp", 1)):
            if p.get(key, value) != value:
                c = copy.deepcopy(m)
                c["pipelines"][i][key] = value
                yield c


def _defaults(m: Mapping) -> Iterator[Mapping]:
    for section in ("costs", "scheduler"):
        for key in sorted(m.get(section, {})):
            c = copy.deepcopy(m)
            del c[section][key]
            if not c[section]:
                del c[section]
            yield c


def _fewer_gpus(m: Mapping) -> Iterator[Mapping]:
    """Renumber the GPUs in use onto the smallest single-node cluster that holds them."""
    used = sorted({g for p in m["pipelines"] for g in p["infer_gpus"] + p["train_gpus"]})
    cluster = m["cluster"]
    total = cluster["nodes"] * cluster["gpus_per_node"]
    size = len(used) + len(used) % 2
    if size >= total:
        return
    new = {g: i for i, g in enumerate(used)}
    c = copy.deepcopy(m)
    c["cluster"]["nodes"], c["cluster"]["gpus_per_node"] = 1, size
    for p in c["pipelines"]:
        p["infer_gpus"] = [new[g] for g in p["infer_gpus"]]
        p["train_gpus"] = [new[g] for g in p["train_gpus"]]
    yield c


_STEPS: List[Callable[[Mapping], Iterator[Mapping]]] = [
    _drop_pipeline,
    _drop_fault,
    _drop_rank,
    _fewer_steps,
    _smaller_pipelines,
    _defaults,
    _fewer_gpus,
]


def signature_of(mapping: Mapping, explore: Any = None, upstream_as_findings: bool = False) -> Optional[str]:
    """The mapping's signature (under the schedule seed ``explore``, an ExploreSpec, kept
    through the whole shrink), or None when the loader refuses it."""
    try:
        scenario = scenario_from_mapping(mapping, source="minimize")
    except ScenarioError:
        return None
    try:
        return run_scenario(scenario, explore, upstream_as_findings)["signature"]
    except Exception as e:  # a crash is a signature too
        return f"crashed:{type(e).__name__}"


def minimize(
    mapping: Mapping,
    target: str,
    *,
    max_runs: int = 120,
    wall_s: Optional[float] = None,
    signature_fn: Callable[[Mapping], Optional[str]] = signature_of,
) -> Tuple[Mapping, int]:
    """The smallest mapping found whose run still has signature ``target``, and the number
    of candidate runs it took. It stops after ``max_runs`` candidate runs or ``wall_s``
    seconds, with the smallest reproducer found so far."""
    best = copy.deepcopy(mapping)
    runs = 0
    improved = True
    stop_at = None if wall_s is None else time.monotonic() + wall_s

    def spent() -> bool:
        return runs >= max_runs or (stop_at is not None and time.monotonic() >= stop_at)

    while improved and not spent():
        improved = False
        for step in _STEPS:
            for candidate in step(best):
                if spent():
                    break
                runs += 1
                if signature_fn(candidate) == target:
                    best, improved = candidate, True
                    break
            if improved:
                break
    return best, runs
