"""The record kinds of the event log, version 1: one table every reader and writer uses.

A kind is an *input* (something the scheduler is told), a *decision* (something the
scheduler model decided), the *header*, or a kind added by a runtime (gates, simulator),
which replay passes over. The JSON Schema file shipped in this package is generated
from this table (``python -m harness.logs.schema --write``) and a test checks the two
agree, so the documentation, the schema and the reader cannot drift apart.

Field types: int, number, str, bool, object, list, int_list, priority (a name such as
"GENERATION" or 0..6), any. A trailing "?" means the value may be null.
"""

from __future__ import annotations

from typing import Dict

from harness.eventlog.kinds_dataplane import DATAPLANE_KINDS
from harness.eventlog.kinds_gate import GATE_KINDS
from harness.eventlog.kinds_refit import REFIT_KINDS
from harness.eventlog.kinds_runtime import EFFECT_KINDS
from harness.eventlog.kinds_sim import SIM_KINDS
from harness.eventlog.kinds_streaming import STREAMING_KINDS
from harness.eventlog.kinds_sync import RETIRED_KINDS, SYNC_KINDS  # noqa: F401 (RETIRED_KINDS: the reader's)

SCHEMA_NAME = "rlharness.eventlog"
SCHEMA_VERSION = 1
COMMON_FIELDS = ("seq", "t", "kind")

HEADER: Dict[str, dict] = {
    "header": {
        "required": {"schema": "str", "version": "int", "cluster": "object"},
        "optional": {"scheduler": "object", "source": "str", "meta": "object"},
        "doc": "First record of every log: schema name and version, cluster {nodes, gpus_per_node}, scheduler options.",
    },
}

INPUT_KINDS: Dict[str, dict] = {
    "register": {
        "required": {"pipeline_id": "str", "cluster_tp_configs": "object", "cluster_device_mappings": "object"},
        "optional": {"namespace": "str", "topology": "str", "train_parallel_size": "int"},
        "doc": "register_pipeline; topology='partial_overlap' also applies the F10 partial-overlap rules.",
    },
    "admit": {"required": {"pipeline_id": "str"}, "optional": {}, "doc": "admit_pipeline."},
    "unregister": {
        "required": {"pipeline_id": "str"},
        "optional": {},
        "doc": "unregister_pipeline: frees allocations, errors waiters.",
    },
    "request": {
        "required": {"cluster_id": "str", "priority": "priority"},
        "optional": {"global_step": "int?", "step_target_estimate": "int?", "lora_name": "str?"},
        "doc": "request_gpus (blocking in RLix; here a pending request until a 'signalled' decision).",
    },
    "release": {"required": {"cluster_id": "str"}, "optional": {"global_step": "int?"}, "doc": "notify_release_gpus."},
    "release_then_request": {
        "required": {"release_cluster_id": "str", "request_cluster_id": "str", "request_priority": "priority"},
        "optional": {
            "release_global_step": "int?",
            "request_global_step": "int?",
            "request_step_target_estimate": "int?",
            "request_lora_name": "str?",
        },
        "doc": "notify_release_then_request_gpus (atomic).",
    },
    "await_release": {
        "required": {},
        "optional": {"cluster_id": "str", "pipeline_id": "str", "global_step": "int?"},
        "doc": "await_release_gpus: planned shrink-to-zero of a GENERATION cluster (exactly one of cluster_id, pipeline_id).",
    },
    "progress": {
        "required": {"pipeline_id": "str", "step_target": "int", "completed": "number"},
        "optional": {"mode": "str", "adapter": "str?", "remaining": "any", "new_batch": "bool"},
        "doc": "report_progress as it reaches the scheduler (after coordinator aggregation). A wire 'remaining' is rejected.",
    },
    "clear_progress": {"required": {"pipeline_id": "str"}, "optional": {}, "doc": "clear_progress."},
    "cycle": {
        "required": {},
        "optional": {"phase": "str", "reason": "str"},
        "doc": "Run a scheduling cycle now. phase: full (default) | plan (phases 0.5-5) | commit (resizes + phase 6); inputs between plan and commit land in the lock gap.",
    },
}

DECISION_KINDS: Dict[str, dict] = {
    "enqueued": {
        "required": {"request_id": "int", "cluster_id": "str", "priority": "str"},
        "optional": {},
        "doc": "A request is now pending.",
    },
    "release_pending": {
        "required": {"request_id": "int", "cluster_id": "str", "dp_ranks": "int_list"},
        "optional": {},
        "doc": "A planned release waits for the next cycle.",
    },
    "released": {
        "required": {"cluster_id": "str", "gpus": "int_list", "reason": "str"},
        "optional": {},
        "doc": "An allocation returned its GPUs to idle (release or unregister).",
    },
    "cycle_start": {"required": {"cycle": "int", "reason": "str"}, "optional": {}, "doc": "A scheduling cycle begins."},
    "plan": {
        "required": {"cycle": "int", "shrinks": "list", "signals": "list", "expands": "list"},
        "optional": {},
        "doc": "The validated plan: shrinks [{cluster_id, bundles:[{dp_rank,gpus}]}], signals [{cluster_id, priority, gpus}], expands [{cluster_id, has_pending_request, bundles}].",
    },
    "validation_failed": {
        "required": {"cycle": "int", "condition": "int", "message": "str", "context": "object"},
        "optional": {},
        "doc": "A plan broke validation condition N (fatal).",
    },
    "resize_start": {
        "required": {"cycle": "int", "pipeline_id": "str", "phase": "str", "dp_ranks": "int_list"},
        "optional": {},
        "doc": "A coordinator resize_infer call starts (phase shrink|expand).",
    },
    "resize_end": {
        "required": {"cycle": "int", "pipeline_id": "str", "phase": "str", "dp_ranks": "int_list"},
        "optional": {},
        "doc": "A resize_infer call returned.",
    },
    "signalled": {
        "required": {
            "request_id": "int",
            "waiter": "str",
            "cluster_id": "str",
            "priority": "str?",
            "gpus": "int_list",
            "cycle": "int?",
            "error": "str?",
        },
        # shrink_executed: written by earlier versions (the model's word on its own ack); still
        # read without error, never written, and no check reads it
        "optional": {"shrink_executed": "bool"},
        "doc": "A blocked call returns: waiter request|planned_release; cycle null = returned at once or by unregister.",
    },
    "commit": {
        "required": {"cycle": "int", "idle_gpus": "int", "skipped_stale": "list"},
        "optional": {},
        "doc": "Phase 6 applied; idle_gpus is the idle count after it.",
    },
    "rejected": {
        "required": {"input_seq": "int", "input_kind": "str", "reason": "str"},
        "optional": {},
        "doc": "An input RLix would refuse; replay goes on.",
    },
    "scheduler_failed": {
        "required": {"cycle": "int?", "reason": "str"},
        "optional": {},
        "doc": "Fail-fast: every waiter is errored, later inputs are rejected.",
    },
}

RUNTIME_KINDS: Dict[str, dict] = {
    **EFFECT_KINDS,
    **SIM_KINDS,
    **GATE_KINDS,
    **DATAPLANE_KINDS,
    **STREAMING_KINDS,
    **REFIT_KINDS,
    **SYNC_KINDS,
}

ALL_KINDS: Dict[str, dict] = {**HEADER, **INPUT_KINDS, **DECISION_KINDS, **RUNTIME_KINDS}


def category(kind: str) -> str:
    if kind in HEADER:
        return "header"
    if kind in INPUT_KINDS:
        return "input"
    if kind in DECISION_KINDS:
        return "decision"
    return "runtime"
