"""How many prompt groups a single controller's rollout buffer needs so that it cannot
deadlock on its own settings (``rlharness preflight``; docs/preflight.md).

Two kinds of sampler consume the buffer differently (``samplers.py``):

* a **gated** sampler (``in_order``, ``weight_fifo``, ``ready_first``) admits up to
  ``window + 1`` batches ahead of the trainer; those can fill every slot while the batch the
  trainer waits for is still unreserved, so it needs ``groups_per_step x (window + 1)``
  (what :func:`harness.streaming.controller.check_capacity` enforces at load time);
* an **ungated** sampler (``windowed``) dispatches freely and the trainer consumes per
  chunk: its select returns once ``min_groups_for_streaming_train`` groups are ready and
  each selected group frees its slot at once. It deadlocks exactly when the buffer cannot
  hold one chunk: ``max_buffered_rollouts < min_groups_for_streaming_train``.

NeMo RL's setup check (NVIDIA-NeMo/RL ``nemo_rl/algorithms/async_utils/staleness_sampler.py``,
``required_buffer_capacity_for_config``) asked nothing of an ungated sampler until PR #3730,
and since then asks it for a whole step (``groups_per_step``): the first passed a windowed
run whose ``min_groups`` equals the step and whose buffer is smaller (it wedges), the second
refuses windowed runs with ``min_groups <= max_buffered_rollouts < groups_per_step`` that
run. :func:`upstream_requirement` gives that check's figure so the two can be shown side by side.
"""

from __future__ import annotations

from typing import NamedTuple


class Capacity(NamedTuple):
    needed: int  # groups the buffer must hold
    why: str


def required_capacity(gated: bool, groups_per_step: int, window: int, min_groups: int) -> Capacity:
    """The smallest ``max_buffered_rollouts`` with which the pumps cannot wedge on the buffer."""
    if gated:
        return Capacity(
            groups_per_step * (window + 1),
            f"a gated sampler admits window + 1 = {window + 1} batches of {groups_per_step} groups ahead",
        )
    return Capacity(
        min_groups,
        f"an ungated sampler's trainer takes a chunk of min_groups_for_streaming_train = "
        f"{min_groups} groups, each freeing its slot when selected",
    )


def upstream_requirement(gated: bool, groups_per_step: int, window: int) -> int:
    """NeMo RL's setup check after PR #3730 (a gated sampler's window, else one whole step)."""
    return groups_per_step * (window + 1) if gated else groups_per_step
