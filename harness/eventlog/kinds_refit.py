"""Record kinds of the refit stream's wire (gpu_gates/transports/zmq_stream.py), read by ``refit_wire``.

Written by whoever runs the real transport (the refit gate, the selective-sync and
dual-pipeline gates' same-GPU path). ``rank`` is optional: a gate adds it, a bare
transport run in a test has none. ``peer`` names the other side, ``step`` the sync.
"""

from typing import Optional

_S = {"step": "int", "role": "str", "peer": "str"}


def _kind(doc: str, required: dict, optional: Optional[dict] = None) -> dict:
    return {"required": {**_S, **required}, "optional": {"rank": "int", **(optional or {})}, "doc": doc}


REFIT_KINDS: dict = {
    "refit_stream_begin": _kind(
        "One side of a refit stream starts (sender: budget and half buffer; receiver: the manifest's expected names).",
        {},
        {"budget_bytes": "int", "half_bytes": "int", "tensors": "int", "expected": "list"},
    ),
    "refit_group_send": _kind(
        "The sender sent one data group (buffer 0|1|dedicated) with its slots.",
        {"group": "int", "buffer": "str", "bytes": "int", "names": "list", "offsets": "int_list", "sizes": "int_list"},
    ),
    "refit_group_recv": _kind(
        "The receiver got one data group.",
        {"group": "int", "buffer": "str", "bytes": "int", "names": "list", "offsets": "int_list"},
    ),
    "refit_ack": _kind("The sender collected an ACK (group number, or 'complete').", {"group": "str"}),
    "refit_complete_send": _kind("The sender sent COMPLETE after its data groups.", {"groups": "int"}),
    "refit_manifest_check": _kind(
        "The receiver's manifest check at COMPLETE (lists of names; empty = clean).",
        {"missing": "list", "duplicate": "list", "unexpected": "list"},
        {"mismatched": "list", "layout": "list", "load_errors": "list"},
    ),
    "refit_finalize": _kind("The receiver finalized the transfer (post-load processing).", {"groups": "int"}),
    "refit_stream_abort": _kind(
        "One side gave up its stream (a timeout, a socket or protocol error, a failed "
        "manifest, a load that killed it): it sends and waits for nothing more.",
        {"error": "str"},
    ),
}
