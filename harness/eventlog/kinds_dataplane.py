"""Record kinds of the data plane (harness/dataplane), written by gates and the simulator.

One ``dp_transfer`` per hop that moved bytes: ``hop`` is ``<role>_to_store`` for a put,
``store_to_<role>`` for a get (role producer|worker|driver), ``leader_to_siblings`` for a
replica leader's broadcast, ``driver_meta`` for metadata the driver handed to a worker.
``bytes`` is what was encoded or decoded, not a claim. The ``data_plane`` check reads these records,
``dp_clear`` and ``dp_write_refused``.
"""

_WHO = {"actor": "str", "role": "str", "partition": "str"}
_OPT = {"dp_rank": "int", "rank": "int", "pipeline_id": "str", "step": "int?"}

DATAPLANE_KINDS: dict = {
    "dp_transfer": {
        "required": {**_WHO, "hop": "str", "samples": "list", "fields": "list", "bytes": "int"},
        "optional": {**_OPT, "bulk": "bool", "to": "str", "duration": "number"},
        "doc": "Bytes moved on one data-plane hop (producer_to_store, store_to_worker, worker_to_store, "
        "leader_to_siblings, driver_meta, store_to_driver, ...).",
    },
    "dp_write_refused": {
        "required": {**_WHO, "samples": "list", "fields": "list", "code": "int", "reason": "str"},
        "optional": dict(_OPT),
        "doc": "The store refused a write of rows already written (-601 ILLEGAL_CLIENT class).",
    },
    "dp_clear": {
        "required": {**_WHO, "samples": "list?"},
        "optional": dict(_OPT),
        "doc": "clear_samples: the samples (or, null, the whole partition) were dropped.",
    },
}
