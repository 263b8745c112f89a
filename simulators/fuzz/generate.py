"""One seed, one scenario: the swarm's scenario generator.

Swarm testing (FoundationDB's simulation, TigerBeetle's VOPR; docs/modelled-systems.md#test-harness-anchors) draws a
different world per seed — topology, pipelines, workloads, costs, scheduler options and
a fault mix — so that thousands of seeds cover combinations nobody would write by hand.
Every drawn scenario is valid by construction (it passes the same loader as a scenario
file: :func:`simulators.scenario.loader.scenario_from_mapping`), so a finding is always about
the modelled system, never about the generator.

Reproducibility across Python versions: only ``random.Random.random()`` is guaranteed to
give the same sequence on every Python release (the other methods of ``random`` may
change their algorithms), so every draw here is built on it.
"""

from __future__ import annotations

import random
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, TypeVar

from simulators.scenario.loader import scenario_from_mapping
from simulators.scenario.spec import FAULT_NAMES, ORACLE_FAULT_NAMES, PIPELINE_TYPES, Scenario

T = TypeVar("T")

GiB = 1 << 30


class Draw:
    """Every draw of one seed, from ``random.Random(seed).random()`` only."""

    def __init__(self, seed: int) -> None:
        self._r = random.Random(seed)

    def unit(self) -> float:
        return self._r.random()

    def int(self, lo: int, hi: int) -> int:
        """Uniform integer in [lo, hi]."""
        return lo + min(int(self.unit() * (hi - lo + 1)), hi - lo)

    def choice(self, items: Sequence[T]) -> T:
        return items[self.int(0, len(items) - 1)]

    def chance(self, p: float) -> bool:
        return self.unit() < p

    def subset(self, items: Sequence[T], k: int) -> List[T]:
        """``k`` distinct items, in the order of ``items``."""
        pool = list(items)
        picked = []
        for _ in range(k):
            picked.append(pool.pop(self.int(0, len(pool) - 1)))
        return [x for x in items if x in picked]


def _tp_groups(nodes: int, gpus_per_node: int, tp: int) -> List[Tuple[int, ...]]:
    """Aligned TP bundles that stay inside one node (RLix's canonical bundles)."""
    out = []
    for n in range(nodes):
        base = n * gpus_per_node
        for i in range(0, gpus_per_node - tp + 1, tp):
            out.append(tuple(range(base + i, base + i + tp)))
    return out


def _mappings(
    d: Draw, ptype: str, nodes: int, gpn: int, taken: Set[int], reserved: Set[int]
) -> Optional[Tuple[int, List[int], List[int]]]:
    """(infer_tp, train_gpus, infer_gpus) satisfying the type's registration rules, or None
    when the GPUs left cannot host the type.

    ``taken``: GPUs of earlier pipelines; ``reserved``: GPUs of earlier single controllers.
    A single controller does not go through the scheduler (it holds its GPUs for the whole
    run), so it gets GPUs nobody else uses, and later pipelines keep off them."""
    tp = 2 if gpn >= 4 and d.chance(0.3) else 1
    groups = _tp_groups(nodes, gpn, tp)
    if ptype in ("single_controller", "disaggregated"):
        free = [grp for grp in groups if not set(grp) & taken]
        if len(free) < 2:  # one group serves, the GPUs of another train
            return None
        dp = d.int(1, min(len(free) - 1, 3))
        infer = sorted(g for grp in d.subset(free, dp) for g in grp)
        rest = sorted(g for grp in free for g in grp if g not in infer)
        return tp, d.subset(rest, d.int(1, min(len(rest), 2))), infer
    groups = [grp for grp in groups if not set(grp) & reserved]
    min_dp = 2 if ptype == "nemo_async" else 1
    if len(groups) < min_dp:
        return None
    dp = d.int(min_dp, min(len(groups), 4))
    infer = sorted(g for grp in d.subset(groups, dp) for g in grp)
    if ptype == "nemo_async":
        # partial overlap: train ⊂ infer and at least one whole DP rank keeps serving
        train_max = len(infer) - tp
    else:
        train_max = len(infer)
    k = d.int(1, max(1, min(train_max, 4)))
    return tp, d.subset(infer, k), infer


def _pipeline(
    d: Draw, index: int, ptype: str, nodes: int, gpn: int, vram_gib: int, tp: int, train: List[int], infer: List[int]
) -> Dict[str, Any]:
    # training holds about 16 bytes a parameter (CostSpec.train_state_multiplier x bf16) on
    # one GPU: a model that cannot train on the drawn GPU would only rediscover that
    params = d.choice([p for p in (0.5e9, 0.5e9, 1.5e9, 3e9) if p * 16 <= 0.7 * vram_gib * GiB])
    p: Dict[str, Any] = {
        "name": f"p{index}",
        "type": ptype,
        "train_gpus": train,
        "infer_gpus": infer,
        "infer_tp": tp,
        "steps": d.int(1, 4),
        "sleep_level": d.choice([1, 2, 2]),
        "start_s": float(d.choice([0, 0, d.int(1, 30)])),
        "model": {"params": params},
        "workload": {
            "prompts_per_step": d.int(1, 8),
            "generations_per_prompt": d.int(1, 4),
            "decode_tokens_median": float(d.choice([64, 128, 256, 512])),
            "decode_tokens_sigma": d.choice([0.3, 0.8, 1.2]),
            "max_trajectory_age_steps": d.int(0, 2),
        },
    }
    if ptype == "single_controller":
        p["streaming"] = _streaming(d, p["workload"]["prompts_per_step"])
    if ptype == "disaggregated":
        p["disaggregated"] = {
            "shape": d.choice(["sync", "one_step_off", "fully_async"]),
            "weight_sync": d.choice(["drain", "pause", "in_flight"]),
        }
    return p


def _streaming(d: Draw, groups_per_step: int) -> Dict[str, Any]:
    """The single controller's knobs, with a buffer large enough for the sampler's window
    (a smaller one is refused at setup: it would deadlock)."""
    window = d.int(1, 2)
    out: Dict[str, Any] = {
        "sampler": d.choice(["in_order", "weight_fifo", "windowed", "ready_first"]),
        "window": window,
        "min_groups_for_streaming_train": d.int(1, groups_per_step),
        "max_buffered_rollouts": groups_per_step * (window + 1) + d.int(0, 8),
        "microbatch_groups": d.int(1, 2),
    }
    if d.chance(0.2):
        out["infra_failure_rate"] = d.choice([0.05, 0.2])
    if d.chance(0.2):
        out["data_failure_rate"] = d.choice([0.05, 0.2])
    return out


def _costs(d: Draw) -> Dict[str, Any]:
    costs: Dict[str, Any] = {}
    if d.chance(0.4):
        costs["train_s_per_trajectory"] = d.choice([0.1, 0.5, 2.0])
    if d.chance(0.3):
        costs["wake_s"] = d.choice([0.3, 0.8, 3.0])
    if d.chance(0.3):
        costs["bucket_bytes"] = d.choice([64, 256, 1024]) * (1 << 20)
    if d.chance(0.2):
        costs["nccl_group_create_s"] = d.choice([0.5, 1.5, 5.0])
    return costs


def _scheduler(d: Draw) -> Dict[str, Any]:
    opts: Dict[str, Any] = {}
    for name in ("ack_unplanned_releases", "rollback_ungrantable_preemption", "head_of_line_blocking"):
        if d.chance(0.25):
            opts[name] = name != "ack_unplanned_releases"  # the non-default value
    return opts


#: the faults a generated scenario may carry: the oracle's own fault hooks are left out, so
#: the seeds draw what they drew before those existed
_DRAWN_FAULTS = tuple(f for f in FAULT_NAMES if f not in ORACLE_FAULT_NAMES)


def _faults(d: Draw, pipelines: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    if d.chance(0.5):
        return []
    out: List[Dict[str, Any]] = []
    for _ in range(d.int(1, 2)):
        p = d.choice(pipelines)
        fault = {"name": d.choice(list(_DRAWN_FAULTS)), "pipeline": p["name"], "at_step": d.int(0, p["steps"] - 1)}
        if all((f["name"], f["pipeline"]) != (fault["name"], fault["pipeline"]) for f in out):
            out.append(fault)
    return out


def scenario_mapping(seed: int) -> Dict[str, Any]:
    """The scenario of ``seed`` as a scenario-file mapping (what ``--out`` writes back)."""
    d = Draw(seed)
    nodes = d.choice([1, 1, 1, 2])
    gpn = d.choice([2, 4, 4, 8])
    vram_gib = d.choice([24, 40, 80, 80])
    types = [t for t in PIPELINE_TYPES if t in _SUPPORTED_TYPES]
    n = d.int(1, 4)
    pipelines: List[Dict[str, Any]] = []
    taken: Set[int] = set()
    reserved: Set[int] = set()
    for i in range(n):
        ptype = d.choice(types)
        drawn = _mappings(d, ptype, nodes, gpn, taken, reserved)
        if drawn is None:  # the GPUs left cannot host that type: a colocated pipeline instead
            ptype = "roll_sync"
            drawn = _mappings(d, ptype, nodes, gpn, taken, reserved)
        if drawn is None:  # single controllers hold every GPU: no more pipelines
            break
        tp, train, infer = drawn
        pipelines.append(_pipeline(d, i, ptype, nodes, gpn, vram_gib, tp, train, infer))
        taken.update(train, infer)
        if ptype in ("single_controller", "disaggregated"):  # outside the scheduler: GPUs of their own
            reserved.update(train, infer)
    mapping: Dict[str, Any] = {
        "name": f"fuzz_{seed}",
        "description": f"generated by rlharness fuzz from seed {seed}",
        "seed": seed,
        "horizon_s": 1800,
        "cluster": {"nodes": nodes, "gpus_per_node": gpn, "vram_bytes": vram_gib * GiB},
        "pipelines": pipelines,
    }
    costs = _costs(d)
    if costs:
        mapping["costs"] = costs
    sched = _scheduler(d)
    if sched:
        mapping["scheduler"] = sched
    faults = _faults(d, pipelines)
    if faults:
        mapping["faults"] = faults
    return mapping


# Pipeline types the generator knows how to draw (a type the simulator adds joins the
# swarm with a drawing rule in ``_mappings`` / ``_pipeline``; a test checks none is missing).
_SUPPORTED_TYPES = ("nemo_async", "roll_sync", "single_controller", "disaggregated")


def scenario_for_seed(seed: int) -> Scenario:
    """The scenario of ``seed``, validated by the scenario loader."""
    return scenario_from_mapping(scenario_mapping(seed), source=f"fuzz seed {seed}")
