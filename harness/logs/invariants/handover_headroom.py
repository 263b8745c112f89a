"""How much memory a residue left on a handed-over GPU leaves the cluster that gets it.

The ``handover`` check says *that* a GPU was granted while another cluster's bytes were
still on it; some of those residues are known upstream behaviour (NeMo's init keeps its
Megatron groups: harness/logs/known_upstream.py) and are not a finding by themselves. What
decides whether the residue hurts is the headroom it leaves: a woken vLLM rank takes
``kv_cache_fraction`` of the GPU for weights and KV cache, and whatever else the GPU must
still take during the wake — a sync bucket staged on it, communicator buffers, another
pipeline's CUDA context — must fit in what is left beside the residue.

For every unclean handover (the handover check's rule: another cluster holds more than
its documented residue when the GPU is granted) the *window* runs from the grant to the
end of the wake it hands the GPU to: the ``resize_end`` of that expand for a GENERATION
grant, the cluster's ``released`` for any other grant (or the log's end). The window's
headroom is the least free memory the GPU had in it (capacity minus resident bytes after
each ``vram`` record on it).

``handover_headroom``: a window whose headroom falls below the margin is a finding, even
when the residue itself is known behaviour. The margin is the log header's
``meta.handover_margin_bytes`` (a scenario's ``costs.handover_margin_bytes``), else
:data:`DEFAULT_MARGIN_BYTES`. The same windows are the summary's per-handover rows
(harness/logs/outputs/headroom.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from harness.logs.invariants.base import Records, Violation, invariant
from harness.logs.invariants.handover import _Holders, _residue, cluster_of

GIB = 1 << 30
#: least free memory a wake must keep beside a residue: a sync bucket (RLix's default bucket
#: is 512 MiB) plus its scratch, or another TP group's communicator buffers
DEFAULT_MARGIN_BYTES = 1 * GIB

READS = ("vram", "oom", "plan", "resize_start", "resize_end", "signalled", "released")


@dataclass
class Window:
    """One unclean handover and the least free memory on its GPU until the wake it served ended."""

    seq: int
    t: float
    gpu: int
    cluster: str  # the cluster the GPU was granted to
    residue: Dict[str, int]  # other cluster -> bytes it left above nothing
    phases: Dict[str, str]  # other cluster -> the phase(s) that loaded them
    headroom: Optional[int] = None  # least free bytes in the window (None: no capacity in the header)
    low_seq: int = -1  # where it was least
    end_seq: Optional[int] = None
    owners_at_low: Dict[str, int] = field(default_factory=dict)

    def residue_bytes(self) -> int:
        return sum(self.residue.values())


def capacity_of(records: Records) -> Optional[int]:
    head = records[0] if records and records[0].get("kind") == "header" else None
    gib = None if head is None else (head.get("cluster") or {}).get("vram_gib")
    return None if gib is None else int(round(gib * GIB))


def margin_of(records: Records) -> int:
    head = records[0] if records and records[0].get("kind") == "header" else {}
    value = (head.get("meta") or {}).get("handover_margin_bytes")
    return int(value) if isinstance(value, (int, float)) else DEFAULT_MARGIN_BYTES


#: the kinds of the records that can end a window (:func:`_ends`)
_ENDING_KINDS = frozenset(("resize_end", "released"))


def _ends(r: dict, w: Window) -> bool:
    """Whether record ``r`` ends the wake window ``w`` opened."""
    if w.cluster.endswith("_actor_infer") and r["kind"] == "resize_end" and r["phase"] == "expand":
        return f"{r['pipeline_id']}_actor_infer" == w.cluster
    return r["kind"] == "released" and r.get("cluster_id") == w.cluster and w.gpu in r.get("gpus", ())


def _others(
    on: Dict[Tuple[str, str], int], left_by: Dict[Tuple[str, str], Optional[str]], cid: str
) -> Tuple[Dict[str, int], Dict[str, str]]:
    """Bytes (and the phases that loaded them) of each cluster other than ``cid`` above its residue."""
    by: Dict[str, int] = {}
    phases: Dict[str, set] = {}
    for (owner, kind), nbytes in on.items():
        if nbytes <= 0:  # (freed: most of a long run's entries; its owner not parsed)
            continue
        other = cluster_of(owner)
        if other is not None and other != cid:
            by[other] = by.get(other, 0) + nbytes
            phases.setdefault(other, set()).add(left_by.get((owner, kind)) or "unknown")
    over = {o: b for o, b in sorted(by.items()) if b > _residue(o)}
    return over, {o: "/".join(sorted(phases[o])) for o in over}


def handover_windows(records: Records) -> List[Window]:
    """Every unclean handover with the least free memory on its GPU until its wake ended."""
    cap = capacity_of(records)
    holders = _Holders()
    resident: Dict[int, Dict[Tuple[str, str], int]] = {}
    left_by: Dict[int, Dict[Tuple[str, str], Optional[str]]] = {}
    used: Dict[int, int] = {}
    open_: Dict[int, List[Window]] = {}  # gpu -> windows still open on it
    out: List[Window] = []

    def see(w: Window, seq: int, asked: int = 0) -> bool:
        """Lower ``w``'s least free memory to now's, if lower; whether it was."""
        if cap is None:
            return False
        free = cap - used.get(w.gpu, 0) - asked  # an allocation that did not fit: below zero
        if w.headroom is None or free < w.headroom:
            w.headroom, w.low_seq = free, seq
            w.owners_at_low = {o: b for o, b in _by_owner(resident.get(w.gpu, {})).items() if b > 0}
            return True
        return False

    def see_open(ws: Sequence[Window], seq: int, asked: int = 0) -> None:
        """:func:`see` of the windows open on one GPU, newest first, up to the first one
        it leaves as it was: an older window's least is over a longer stretch of the same
        GPU's records, so never above a newer one's, and is left as it was too (a GPU a
        pipeline never releases would otherwise cost every record the windows it piled up)."""
        for w in reversed(ws):
            if not see(w, seq, asked):
                break

    for r in records:
        kind = r["kind"]
        if kind == "vram":  # nearly every record read: its lookups made once, no dict made per record
            g, key, delta = r["gpu"], (r["owner"], r["mem"]), r["delta"]
            on = resident.get(g)
            if on is None:
                on = resident[g] = {}
            now = on[key] = on.get(key, 0) + delta
            if not now:  # freed: not kept, so a grant's walk of the GPU's bytes (_others) reads what is there
                del on[key]
            used[g] = used.get(g, 0) + delta
            if delta > 0:
                by = left_by.get(g)
                if by is None:
                    by = left_by[g] = {}
                by[key] = r.get("phase")
            ws = open_.get(g)
            if ws:
                see_open(ws, r["seq"])
            continue
        if kind == "oom":
            see_open(open_.get(r["gpu"], ()), r["seq"], r["requested"])
            continue
        if kind in _ENDING_KINDS:  # (no other record ends a window: see _ends)
            for g, ws in list(open_.items()):
                for w in [w for w in ws if _ends(r, w)]:
                    w.end_seq = r["seq"]
                    ws.remove(w)
                if not ws:  # a GPU with no window open is not walked at every ending record
                    del open_[g]
        grant = holders.grant_of(r)
        if grant is None:
            continue
        cid, gpus = grant
        for g in gpus:
            residue, phases = _others(resident.get(g, {}), left_by.get(g, {}), cid)
            if residue:
                w = Window(r["seq"], r.get("t", 0.0), g, cid, residue, phases)
                see(w, r["seq"])
                out.append(w)
                open_.setdefault(g, []).append(w)
    return out


def _by_owner(on: Dict[Tuple[str, str], int]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for (owner, _kind), nbytes in sorted(on.items()):
        out[owner] = out.get(owner, 0) + nbytes
    return out


def gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f} GiB"


@invariant("handover_headroom", reads=READS, sees=("header",))
def handover_headroom(records: Records) -> List[Violation]:
    return headroom_findings(handover_windows(records), margin_of(records))


def headroom_findings(windows: Sequence[Window], margin: int) -> List[Violation]:
    """The ``handover_headroom`` findings of a log's windows (:func:`handover_windows`).
    Apart from the check so that a run which makes the windows anyway (the summary's
    headroom table, harness/logs/outputs/headroom.py, reads the same kinds) judges them
    without walking its VRAM records a second time (simulators/run_streamed.py)."""
    out: List[Violation] = []
    for w in windows:
        if w.headroom is None or w.headroom >= margin:
            continue
        left = ", ".join(f"{o}'s {b} B (phase {w.phases[o]})" for o, b in w.residue.items())
        out.append(
            Violation(
                "handover_headroom",
                w.low_seq,
                f"GPU {w.gpu} granted to {w.cluster} (seq {w.seq}) with {left} still on it: the wake's "
                f"headroom fell to {w.headroom} B ({gib(w.headroom)}) at seq {w.low_seq}, under the "
                f"margin {margin} B ({gib(margin)})",
            )
        )
    return out
