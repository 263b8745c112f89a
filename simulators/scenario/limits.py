"""Size limits of a scenario (:mod:`harness.limits`), checked once it is validated.

The field rules (``scenario_rules.py``) say what a value may be; these say how much work
a whole scenario may ask for, before a simulation allocates anything: a cluster of
100 000 000 nodes or 100 000 000 prompts per step is one error line naming the field
and the limit, not a run that grows until memory runs out. The scenario's ``name`` also
names its run folder (``runs/<name>``), so it must be a plain file name.
"""

from __future__ import annotations

import re
from typing import Callable

from harness.limits import (
    MAX_CONCURRENT_PER_RANK,
    MAX_DECODE_TOKENS,
    MAX_GPUS,
    MAX_HORIZON_S,
    MAX_PIPELINES,
    MAX_STEPS,
    MAX_TRAJECTORIES_PER_RUN,
    MAX_TRAJECTORIES_PER_STEP,
    fmt_limit,
)

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
NAME_RULE = (
    "1-128 letters, digits, '.', '_' or '-', starting with a letter or digit (it names the run folder runs/<name>)"
)


def check_cluster_size(fail: Callable[[str, str], Exception], nodes: int, gpus_per_node: int) -> None:
    """Before a topology is built from them (that allocates per GPU)."""
    if nodes > MAX_GPUS:
        raise fail("cluster.nodes", f"{nodes:,} nodes exceeds the limit of {fmt_limit(MAX_GPUS)} GPUs in a cluster")
    if gpus_per_node > MAX_GPUS:
        raise fail(
            "cluster.gpus_per_node",
            f"{gpus_per_node:,} GPUs per node exceeds the limit of {fmt_limit(MAX_GPUS)} GPUs in a cluster",
        )
    if nodes * gpus_per_node > MAX_GPUS:
        raise fail(
            "cluster",
            f"{nodes:,} nodes x {gpus_per_node:,} GPUs = {nodes * gpus_per_node:,} GPUs "
            f"exceeds the limit of {fmt_limit(MAX_GPUS)}",
        )


def check_name(fail: Callable[[str, str], Exception], name: str) -> None:
    if not NAME_PATTERN.fullmatch(name) or name in (".", ".."):
        raise fail("name", f"{name!r} is not a valid scenario name: {NAME_RULE}")


def check_scale(fail: Callable[[str, str], Exception], horizon_s: float, raw_pipelines: list) -> None:
    """Limits that need no parsed pipeline (checked before any pipeline is built)."""
    if horizon_s > MAX_HORIZON_S:
        raise fail(
            "horizon_s", f"{horizon_s:g} simulated s exceeds the limit of {fmt_limit(MAX_HORIZON_S)} s (30 days)"
        )
    if len(raw_pipelines) > MAX_PIPELINES:
        raise fail("pipelines", f"{len(raw_pipelines):,} pipelines exceeds the limit of {fmt_limit(MAX_PIPELINES)}")


def check_pipeline(fail: Callable[[str, str], Exception], path: str, pipeline) -> int:
    """Per-pipeline limits; returns the pipeline's trajectories over the run."""
    if pipeline.steps > MAX_STEPS:
        raise fail(f"{path}.steps", f"{pipeline.steps:,} steps exceeds the limit of {fmt_limit(MAX_STEPS)}")
    w = pipeline.workload
    per_step = w.prompts_per_step * w.generations_per_prompt
    if per_step > MAX_TRAJECTORIES_PER_STEP:
        field = "prompts_per_step" if w.prompts_per_step >= w.generations_per_prompt else "generations_per_prompt"
        raise fail(
            f"{path}.workload.{field}",
            f"{w.prompts_per_step:,} prompts x {w.generations_per_prompt:,} generations = {per_step:,} trajectories "
            f"per step exceeds the limit of {fmt_limit(MAX_TRAJECTORIES_PER_STEP)}",
        )
    if w.decode_tokens_max > MAX_DECODE_TOKENS:
        raise fail(
            f"{path}.workload.decode_tokens_max",
            f"{w.decode_tokens_max:,} tokens exceeds the limit of {fmt_limit(MAX_DECODE_TOKENS)}",
        )
    if w.max_concurrent_per_rank > MAX_CONCURRENT_PER_RANK:
        raise fail(
            f"{path}.workload.max_concurrent_per_rank",
            f"{w.max_concurrent_per_rank:,} requests exceeds the limit of {fmt_limit(MAX_CONCURRENT_PER_RANK)}",
        )
    return pipeline.steps * per_step


def check_run_total(fail: Callable[[str, str], Exception], trajectories: int) -> None:
    if trajectories > MAX_TRAJECTORIES_PER_RUN:
        raise fail(
            "pipelines",
            f"steps x trajectories per step add up to {trajectories:,} trajectories; the limit "
            f"is {fmt_limit(MAX_TRAJECTORIES_PER_RUN)} per run (it bounds the event log held in memory)",
        )
