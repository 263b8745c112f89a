"""Memory headroom: how close each GPU came to its capacity, in which phase, and what each
unclean handover left the engine it woke.

``ooms: []`` says a run did not run out of memory; it does not say by how much. A user
sizing a layout needs the margin: per GPU the peak resident bytes against capacity, the
moment of the peak (the phase of the allocation that made it, and who held what then),
the same per phase of the pipelines (init, train, wake, syncs), and for every GPU handed
over with another cluster's bytes still on it the residue and the least free memory the
waking engine had until its wake ended (harness/logs/invariants/handover_headroom.py, whose
check makes a window under the margin a finding).

Read from the ``vram`` records and the header's capacity alone, so a gate's or an
imported log reads the same way; a log without ``cluster.vram_gib`` has no headroom.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional

from harness.logs.invariants.base import Violation
from harness.logs.invariants.handover_headroom import (
    GIB,
    READS,
    Window,
    capacity_of,
    handover_windows,
    headroom_findings,
    margin_of,
)


@dataclass
class GpuPeak:
    gpu: int
    peak_bytes: int
    headroom_bytes: int
    t: float
    seq: int
    phase: str  # the phase of the allocation that made the peak (its memory kind where it has none)
    owners: Dict[str, int] = field(default_factory=dict)  # owner -> bytes at the peak


@dataclass
class Headroom:
    capacity_bytes: int
    margin_bytes: int
    gpus: List[GpuPeak]  # by GPU id
    phases: Dict[str, Dict[str, Any]]  # phase -> {peak_bytes, headroom_bytes, gpu, seq}
    handovers: List[Window]

    def tightest(self) -> Optional[GpuPeak]:
        return min(self.gpus, key=lambda g: (g.headroom_bytes, g.gpu)) if self.gpus else None

    def as_json(self) -> Dict[str, Any]:
        tight = self.tightest()
        return {
            "capacity_bytes": self.capacity_bytes,
            "margin_bytes": self.margin_bytes,
            "tightest": None if tight is None else asdict(tight),
            "gpus": [asdict(g) for g in self.gpus],
            "phases": self.phases,
            "handovers": [
                {
                    "seq": w.seq,
                    "t": w.t,
                    "gpu": w.gpu,
                    "granted_to": w.cluster,
                    "residue": w.residue,
                    "residue_bytes": w.residue_bytes(),
                    "left_by_phase": w.phases,
                    "wake_headroom_bytes": w.headroom,
                    "at_seq": w.low_seq,
                    "window_end_seq": w.end_seq,
                    "owners_at_least": w.owners_at_low,
                }
                for w in self.handovers
            ],
        }


#: what the headroom table reads: the header (capacity, margin), then the VRAM ledger and
#: what opens and closes a handover window, in log order
HEADROOM_KINDS = ("header",) + READS


class _HeaderThen:
    """The header, then a one-pass iterable: what :func:`handover_windows` reads (``[0]``,
    then one iteration), without keeping the records."""

    def __init__(self, header: Mapping[str, Any], rest: Iterable[Mapping[str, Any]]) -> None:
        self.header, self.rest = header, rest

    def __bool__(self) -> bool:
        return True

    def __getitem__(self, i: int) -> Mapping[str, Any]:
        if i != 0:
            raise IndexError("a one-pass view has only its header by index")
        return self.header

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        return iter(self.rest)


class _Peaks:
    """Per GPU and per phase, the highest resident bytes and who held what then."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.used: Dict[int, int] = {}
        self.held: Dict[int, Dict[str, int]] = {}
        self.gpus: Dict[int, GpuPeak] = {}
        self.phases: Dict[str, Dict[str, Any]] = {}

    def tap(self, records: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
        """The records as they pass, each ``vram`` record seen on its way (inline, its
        lookups bound once: the pass's most frequent record)."""
        cap, used, held, gpus, phases = self.cap, self.used, self.held, self.gpus, self.phases
        for r in records:
            if r["kind"] != "vram":
                yield r
                continue
            g, delta, owner = r["gpu"], r["delta"], r["owner"]
            now = used[g] = used.get(g, 0) + delta
            on = held.get(g)
            if on is None:  # (not setdefault: no dict made per record)
                on = held[g] = {}
            on[owner] = on.get(owner, 0) + delta
            if delta > 0:
                phase = r.get("phase") or r["mem"]
                best = gpus.get(g)
                if best is None or now > best.peak_bytes:
                    held_now = {o: b for o, b in sorted(on.items()) if b > 0}
                    gpus[g] = GpuPeak(g, now, cap - now, r["t"], r["seq"], phase, held_now)
                p = phases.get(phase)
                if p is None or now > p["peak_bytes"]:
                    phases[phase] = {
                        "peak_bytes": now,
                        "headroom_bytes": cap - now,
                        "gpu": g,
                        "seq": r["seq"],
                        "t": r["t"],
                    }
            yield r


def headroom(records: Iterable[Mapping[str, Any]], end: Any = None) -> Optional[Headroom]:
    """The headroom figures of a log, in one pass over its header and its records of
    :data:`HEADROOM_KINDS` (a table of ``harness.logs.outputs.derived.DERIVED``, so a
    streamed run derives it as its records pass); None without a capacity in the header."""
    it = iter(records)
    head = next(it, None)
    cap = None if head is None else capacity_of([dict(head)])
    if head is None or cap is None:
        for _ in it:  # the pass is read to its end either way
            pass
        return None
    peaks = _Peaks(cap)
    windows = handover_windows(_HeaderThen(head, peaks.tap(it)))  # type: ignore[arg-type]
    return Headroom(
        cap,
        margin_of([dict(head)]),
        [peaks.gpus[g] for g in sorted(peaks.gpus)],
        {k: peaks.phases[k] for k in sorted(peaks.phases)},
        windows,
    )


def headroom_findings_of(h: Optional[Headroom]) -> List[Violation]:
    """The ``handover_headroom`` check's findings, from the table: its windows are the
    check's (:func:`handover_windows` of the same kinds, the header first) and its margin
    the header's. Without a capacity there is no table, and the check finds nothing (no
    window has a headroom)."""
    return [] if h is None else headroom_findings(h.handovers, h.margin_bytes)


def _gib(n: Optional[float]) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def _owners(owners: Dict[str, int], shown: int = 4) -> str:
    top = sorted(owners.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{o} {_gib(b)}" for o, b in top[:shown])
    return text + (f", +{len(top) - shown} more" if len(top) > shown else "")


def headroom_lines(h: Optional[Headroom], table, shown: int = 8) -> List[str]:
    """summary.txt's section: the tightest GPUs, each phase's peak, each unclean handover."""
    if h is None or not h.gpus:
        return []
    out = [
        "",
        f"Memory headroom (GiB; capacity {_gib(h.capacity_bytes)} per GPU; peak resident bytes per GPU, "
        f"tightest first; every GPU in summary.json)",
    ]
    rows = [
        [str(g.gpu), _gib(g.peak_bytes), _gib(g.headroom_bytes), g.phase, f"{g.t:.3f}", _owners(g.owners)]
        for g in sorted(h.gpus, key=lambda g: (g.headroom_bytes, g.gpu))[:shown]
    ]
    out += table(["gpu", "peak", "headroom", "phase", "at s", "owners at the peak"], rows, "rrrlrl")
    out.append(
        "by phase: "
        + "; ".join(
            f"{k} peak {_gib(v['peak_bytes'])} (headroom {_gib(v['headroom_bytes'])}, GPU {v['gpu']})"
            for k, v in h.phases.items()
        )
    )
    if h.handovers:
        worst = min(h.handovers, key=lambda w: (w.headroom if w.headroom is not None else 0, w.seq))
        out.append(
            f"handovers with another cluster's bytes left ({len(h.handovers)}): least wake headroom "
            f"{_gib(worst.headroom)} GiB on GPU {worst.gpu} (granted to {worst.cluster} at seq {worst.seq}, "
            f"residue {_gib(worst.residue_bytes())} GiB of {', '.join(worst.residue)}, left by phase "
            f"{'/'.join(sorted(set(worst.phases.values())))}); margin {_gib(h.margin_bytes)} GiB"
        )
        under = any(w.headroom is not None and w.headroom < h.margin_bytes for w in h.handovers)
        rows = [
            [str(w.gpu), w.cluster, _gib(w.residue_bytes()), "/".join(sorted(set(w.phases.values()))), _gib(w.headroom)]
            + (["UNDER MARGIN" if w.headroom < h.margin_bytes else "ok"] if under else [])
            for w in sorted(h.handovers, key=lambda w: (w.headroom if w.headroom is not None else 0, w.seq))[:shown]
        ]
        out += table(
            ["gpu", "granted to", "residue", "left by", "wake headroom"] + (["margin"] if under else []), rows, "rlrlrl"
        )
    return out


def headroom_brief(h: Optional[Headroom]) -> str:
    """One clause for the command's last line: the tightest GPU, and the least wake headroom
    a handover left (with the margin) when there was one."""
    tight = None if h is None else h.tightest()
    if tight is None:
        return ""
    text = f"memory headroom: tightest GPU {tight.gpu} {_gib(tight.headroom_bytes)} GiB ({tight.phase})"
    known = [w.headroom for w in h.handovers if w.headroom is not None]
    if known:
        text += f", least after a handover {_gib(min(known))} GiB (margin {_gib(h.margin_bytes)} GiB)"
    return text
