"""``data_plane``: one write per (sample, field); the driver holds no bulk.

Read from ``dp_transfer`` / ``dp_write_refused`` / ``dp_clear`` records only:

* every put (a ``*_to_store`` hop) writes each of its (partition, sample, field) rows once
  until a ``dp_clear`` drops the sample; a second write — by a non-leader sibling of the
  same DP replica, or by another replica — is the ``-601`` bug class, whether the store
  refused it (``dp_write_refused``) or silently overwrote it;
* the driver moves metadata only: any hop of role ``driver`` other than ``driver_meta``
  that moved bytes means the driver fetched or pushed bulk tensors (the "1-hop" rule);
  and a ``driver_meta`` hop is judged by its bytes, not its label: more than
  ``META_BYTES_PER_ROW`` per (sample, field) row is bulk data riding the metadata hop.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from harness.logs.invariants.base import Records, Violation, invariant

NAME = "data_plane"


def _who(r: dict) -> str:
    dp = r.get("dp_rank")
    return f"{r['actor']}" + (f" (dp {dp})" if dp is not None else "")


#: metadata of one (sample, field) row: ids, shape, dtype, partition — tens of bytes
#: (TransferQueue's BatchMeta); a driver_meta hop above this per row carries tensors
META_BYTES_PER_ROW = 4096


def _bulk_in_meta(r: dict) -> str:
    """Why a ``driver_meta`` hop carried bulk data, derived from its bytes ('' if it did
    not): more than :data:`META_BYTES_PER_ROW` per (sample, field) row. (Comparing with
    the bytes the rows' puts carried would misjudge tiny tensors, whose metadata can
    outweigh them.)"""
    rows = max(1, len(r["samples"]) * len(r["fields"]))
    n = r["bytes"]
    if n > META_BYTES_PER_ROW * rows:
        return f"{n} B for {rows} row(s), above {META_BYTES_PER_ROW} B of metadata per row"
    return ""


@invariant(NAME, reads=("dp_transfer", "dp_write_refused", "dp_clear"))
def data_plane(records: Records) -> List[Violation]:
    out: List[Violation] = []
    written: Dict[Tuple[str, str, str], dict] = {}
    for r in records:
        kind = r["kind"]
        if kind == "dp_clear":
            part, samples = r["partition"], r["samples"]
            for key in [k for k in written if k[0] == part and (samples is None or k[1] in samples)]:
                del written[key]
        elif kind == "dp_write_refused":
            out.append(
                Violation(
                    NAME,
                    r["seq"],
                    f"-601 class: {_who(r)} tried to rewrite {len(r['samples'])} sample(s) "
                    f"x {r['fields']} in {r['partition']!r}; the store refused (code {r['code']})",
                )
            )
        elif kind == "dp_transfer":
            hop = r["hop"]
            if r["role"] == "driver" and hop != "driver_meta" and r["bytes"] > 0:
                out.append(
                    Violation(
                        NAME,
                        r["seq"],
                        f"the driver held bulk tensors: {hop} moved {r['bytes']} B "
                        f"of {r['fields']} for {len(r['samples'])} sample(s)",
                    )
                )
            elif hop == "driver_meta":
                bulk = _bulk_in_meta(r)
                if bulk:
                    out.append(Violation(NAME, r["seq"], f"the driver held bulk tensors: driver_meta moved {bulk}"))
            if hop.endswith("_to_store"):
                dups = []
                for s in r["samples"]:
                    for f in r["fields"]:
                        key = (r["partition"], s, f)
                        first = written.get(key)
                        if first is not None:
                            dups.append((s, f, first))
                        else:
                            written[key] = r
                if dups:
                    s, f, first = dups[0]
                    out.append(
                        Violation(
                            NAME,
                            r["seq"],
                            f"-601 class: {_who(r)} wrote {len(dups)} row(s) already written, e.g. {s}/{f} "
                            f"first by {_who(first)} at seq {first['seq']}",
                        )
                    )
    return out
