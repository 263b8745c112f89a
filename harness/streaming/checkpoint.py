"""Checkpoint and restore of the single controller's rollout buffer (NeMo RL
``TQReplayBuffer.state_dict`` / ``load_state_dict`` and the actor's restore, NVIDIA-NeMo/RL
``nemo_rl/algorithms/async_utils/replay_buffer.py`` and ``nemo_rl/algorithms/single_controller.py``
at 7ea279ab).

A checkpoint taken after step ``k`` holds the *finished* groups and the spare prompt pool;
reservations still generating are not saved (their work is lost with the process). The
restored run resumes the trainer at ``k + 1`` and the sampler's dispatch cursor there, so
a step that had only part of its batch buffered is *topped up*: its admission dispatches
only the groups it still lacks (``ControllerState.buffered_for``). Sans-IO: a snapshot is
a plain dict of ints, the runtime decides where it lives.
"""

from __future__ import annotations

from typing import Any, Dict, List

from harness.streaming.buffer import GroupEntry
from harness.streaming.controller import ControllerState, StreamingConfig


class RestoreError(ValueError):
    """A snapshot this run cannot load (wrong group size, duplicates, over capacity)."""


_GROUP_KEYS = ("group_id", "prompt_id", "start_version", "end_version", "target_step", "size")


def snapshot(st: ControllerState) -> Dict[str, Any]:
    """The state a resumed run needs: ready groups (in reservation order), the spare
    pool, the trainer and weight versions, the sampler that stamped the groups."""
    groups = [{k: getattr(e, k) for k in _GROUP_KEYS} for e in st.buffer.ready()]
    return {
        "sampler": st.cfg.sampler,
        "trainer_version": st.trainer_version,
        "weight_version": st.weight_version,
        "next_group": st.buffer._next_group,
        "groups": groups,
        "reserve": list(st.spares),
        "next_prompt": st.next_prompt,
        "skipped": st.skipped,
        "saved_capacity": st.cfg.max_buffered_rollouts,
    }


def _checked_groups(cfg: StreamingConfig, snap: Dict[str, Any]) -> List[Dict[str, Any]]:
    groups = list(snap["groups"])
    seen = set()
    for g in groups:
        if g["size"] != cfg.generations_per_prompt:
            raise RestoreError(
                f"group {g['group_id']} holds {g['size']} trajectories, this run generates "
                f"{cfg.generations_per_prompt} per prompt (the group baseline would break)"
            )
        if g["group_id"] in seen:
            raise RestoreError(f"group {g['group_id']} appears twice in the checkpoint")
        seen.add(g["group_id"])
    if len(groups) > cfg.max_buffered_rollouts:
        if any(g["target_step"] is not None for g in groups):
            raise RestoreError(
                f"the checkpoint holds {len(groups)} stamped groups, above max_buffered_rollouts "
                f"{cfg.max_buffered_rollouts}: dropping any would leave its step waiting forever"
            )
        keep = sorted(range(len(groups)), key=lambda i: (groups[i]["start_version"], i))[
            len(groups) - cfg.max_buffered_rollouts :
        ]
        groups = [groups[i] for i in sorted(keep)]  # the freshest, in their order
    return groups


def restore(cfg: StreamingConfig, snap: Dict[str, Any]) -> ControllerState:
    """A fresh controller state resumed from ``snap``. A snapshot written under another
    sampler restores no groups (their stamps mean nothing to this one) but keeps the
    pool, as NeMo RL does; the first evict drops restored groups past the window."""
    st = ControllerState(cfg)
    st.trainer_version = snap["trainer_version"]
    st.weight_version = snap["weight_version"]
    st.sampler.set_dispatch_index(snap["trainer_version"])
    st.spares = list(snap["reserve"])
    st.next_prompt = snap["next_prompt"]
    st.skipped = snap["skipped"]
    groups = _checked_groups(cfg, snap) if snap["sampler"] == cfg.sampler else []
    buf = st.buffer
    for g in groups:
        entry = GroupEntry(
            g["group_id"],
            g["prompt_id"],
            g["start_version"],
            g["target_step"],
            buf._reserve_seq,
            ready=True,
            end_version=g["end_version"],
            commit_seq=buf._commit_seq,
            size=g["size"],
        )
        buf._entries[entry.group_id] = entry
        buf._reserve_seq += 1
        buf._commit_seq += 1
    buf._next_group = max([snap["next_group"]] + [g["group_id"] + 1 for g in groups])
    st.capacity_held = st.restored = len(groups)
    st.stamped = any(g["target_step"] is not None for g in groups) or st.stamped
    return st
