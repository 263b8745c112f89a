"""Small builders shared by the invariant firing suites (tests/unit/test_*invariants.py):
renumbering a trace after a test reorders its records, and the header of a hand-written
log (one node of four 1 GiB GPUs, a 100 B post-sleep threshold) and a pipeline's register
record."""

from __future__ import annotations


def reseq(records):
    for i, r in enumerate(records):
        r["seq"] = i
    return records


HEAD = {
    "seq": 0,
    "t": 0,
    "kind": "header",
    "schema": "rlharness.eventlog",
    "version": 1,
    "cluster": {"nodes": 1, "gpus_per_node": 4, "vram_gib": 1.0},
    "meta": {"post_sleep_threshold_bytes": 100},
}


def register(tp_configs, device_mappings):
    """Pipeline p's register record: its clusters' TP sizes and device mappings."""
    return {
        "seq": 1,
        "t": 0,
        "kind": "register",
        "pipeline_id": "p",
        "cluster_tp_configs": tp_configs,
        "cluster_device_mappings": device_mappings,
    }
