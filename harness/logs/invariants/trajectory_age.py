"""``trajectory_age``, the staleness bound for trajectory-buffer pipelines (NeMo RL async GRPO, ROLL): every batch the
trainer consumes is within the pipeline's ``max_trajectory_age_steps``.

NeMo RL's ``ReplayBuffer.sample`` (NVIDIA-NeMo/RL, ``nemo_rl/algorithms/async_utils/replay_buffer.py``)
hands the trainer only trajectories generated at most ``max_trajectory_age_steps`` weight
versions ago. The bound is configuration, so the simulator writes it into the header
(``meta.max_trajectory_age_steps``, pipeline -> steps); the ages come from each
``batch_consumed`` record's ``staleness`` histogram (age in steps -> trajectories).
The single controller's sampler has its own bound (``streaming_setup.max_age``, read by
``staleness_window``).
"""

from __future__ import annotations

from typing import List

from harness.logs.invariants.base import Records, Violation, invariant

NAME = "trajectory_age"


@invariant(NAME, reads=("batch_consumed",), sees=("header",))
def trajectory_age(records: Records) -> List[Violation]:
    """No consumed trajectory is older than its pipeline's bound, nor from the future
    (a negative age)."""
    out: List[Violation] = []
    head = records[0] if records and records[0]["kind"] == "header" else {}
    bounds = (head.get("meta") or {}).get("max_trajectory_age_steps") or {}
    for r in records:
        if r["kind"] != "batch_consumed":
            continue
        bound = bounds.get(r["pipeline_id"])
        if bound is None:
            continue
        ages = {int(a): n for a, n in r["staleness"].items() if n}
        old = sorted(a for a in ages if a > bound or a < 0)
        if old:
            out.append(
                Violation(
                    NAME,
                    r["seq"],
                    f"{r['pipeline_id']} step {r['step']} trained "
                    f"{sum(ages[a] for a in old)} trajectory(ies) of age {old} steps; "
                    f"max_trajectory_age_steps is {bound}",
                )
            )
    return out
