"""N-cycle trends (``cycle_trends``): what a sleep/wake/refit cycle leaves behind stays flat.

A leak of one cycle is too small for a single-cycle gate to see: NeMo RL's memory after
sleep grew from 4.11 GiB to about 25 GiB in three steps (NVIDIA-NeMo/RL issue #2619),
vLLM's IPC staging buffer leaked once per step until a wake ran out of memory (vllm
issue #51258). So this check fits a least-squares line through each measured series
over the cycles and bounds its slope, never a difference of two samples (one noisy
sample cannot fire it, and a small steady leak cannot hide in the noise of one pair).

Four families of series, each a value per cycle:

* ``residue_bytes``: device memory a rank still holds after it was put to sleep;
* ``ipc_bytes``: staging memory the refit's producer (the trainer's IPC side) holds
  after a refit ended;
* ``live_groups``: process groups alive after a cycle;
* ``refit_s``: the wall time of one refit.

Where a series comes from:

* ``trend_sample`` records (``series`` = ``family/key``, ``cycle``, ``value``): what a
  gate measured itself (``gpu_gates/cycle_trends.py``: live tensor bytes or CUDA
  allocator bytes, the producer's ``/dev/shm`` files, c10d's registry, a clock);
* the VRAM ledger of a simulator log, read the way any reader of the log could: the
  bytes a rank's owner (``pipeline/dpN``) holds on its GPUs when its ``rank_state``
  says ``asleep``; the bytes the pipeline's sync owner (``pipeline/sync``) holds at each
  ``sync_end``; the pipeline's sync groups created and not destroyed at each
  ``sync_end``; and ``sync_end`` minus ``sync_start`` per (pipeline, IPC targets,
  broadcast targets) (syncs of another shape take another time by design).

The bound on a series' slope, per cycle, is ``absolute + relative x median(|value|)``
(:data:`BOUNDS`), and for counts the fitted growth over the run must also exceed a floor
(a single step is not a trend); a series with fewer than :data:`MIN_CYCLES` samples is not judged (a
line through three points says little). The bounds are documented in docs/trends.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from harness.logs.invariants.base import Records, Violation, invariant

NAME = "cycle_trends"
MIN_CYCLES = 5


@dataclass(frozen=True)
class Bound:
    """Largest allowed slope per cycle: ``absolute + relative * median(|values|)``."""

    absolute: float
    relative: float
    unit: str
    min_drift: float = 0.0  # the fitted growth over the run (slope x (cycles - 1)) must also exceed this

    def limit(self, values: Sequence[float]) -> float:
        return self.absolute + self.relative * float(np.median(np.abs(np.asarray(values, dtype=float))))


MIB = 1 << 20
BOUNDS: Dict[str, Bound] = {
    # 4 KiB + 0.2 % of the median per cycle (4 % over 20 cycles): the measurements are
    # allocator or file sizes, which a clean cycle leaves exactly where they were; a leaked
    # KV cache, staging buffer or weight copy moves them by its whole size every cycle
    "residue_bytes": Bound(4 * 1024, 0.002, "B"),
    "ipc_bytes": Bound(4 * 1024, 0.002, "B"),
    # one group leaked per cycle is a slope of 1; 0.1 allows one odd group in ten cycles;
    # and the fitted growth must exceed 2 groups: one group stranded once (a step, whose
    # fitted growth is at most 1.5) is the sync_groups check's finding, not a trend
    "live_groups": Bound(0.1, 0.0, "groups", min_drift=2.0),
    # 5 ms + 2 % of the median per cycle: a loaded CI machine's scheduling noise stays
    # under it over 20 cycles, a refit that slows by tens of ms per cycle does not
    "refit_s": Bound(0.005, 0.02, "s"),
}


def fit_slope(cycles: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` over ``cycles`` (numpy ``lstsq``)."""
    x = np.asarray(cycles, dtype=float)
    a = np.vstack([x, np.ones_like(x)]).T
    (slope, _), *_ = np.linalg.lstsq(a, np.asarray(values, dtype=float), rcond=None)
    return float(slope)


@dataclass(frozen=True)
class Trend:
    series: str
    cycles: int
    slope: float
    limit: float
    first: float
    last: float
    seq: int  # the record of the series' last sample

    @property
    def ok(self) -> bool:
        drift = self.slope * (self.cycles - 1)
        return self.slope <= self.limit or drift <= BOUNDS[self.series.split("/", 1)[0]].min_drift

    def describe(self) -> str:
        unit = BOUNDS[self.series.split("/", 1)[0]].unit
        return (
            f"{self.series}: slope {self.slope:.6g} {unit}/cycle over {self.cycles} cycles exceeds the bound "
            f"{self.limit:.6g} {unit}/cycle (first {self.first:.6g}, last {self.last:.6g} {unit})"
        )


def judge(series: str, samples: Sequence[Tuple[int, float, int]]) -> Optional[Trend]:
    """The trend of one series (samples ``(cycle, value, seq)``), or ``None`` when too short."""
    if len(samples) < MIN_CYCLES:
        return None
    family = series.split("/", 1)[0]
    ordered = sorted(samples, key=lambda s: (s[0], s[2]))
    cycles, values = [s[0] for s in ordered], [s[1] for s in ordered]
    return Trend(
        series,
        len(samples),
        fit_slope(cycles, values),
        BOUNDS[family].limit(values),
        values[0],
        values[-1],
        max(s[2] for s in samples),
    )


Series = Dict[str, List[Tuple[int, float, int]]]


def _add(series: Series, name: str, value: float, seq: int, cycle: Optional[int] = None) -> None:
    samples = series.setdefault(name, [])
    samples.append((len(samples) if cycle is None else cycle, float(value), seq))


class _Ledger:
    """The simulator's VRAM ledger and sync records, turned into per-cycle samples."""

    def __init__(self) -> None:
        self.held: Dict[Tuple[int, str], int] = {}
        # the same values for the ``<pipeline>/sync`` owners, per owner in ``held``'s key
        # order: a sync's staged bytes summed without walking every (GPU, owner) held
        self.staging: Dict[str, Dict[int, int]] = {}
        self.open_groups: Dict[str, set] = {}
        self.sync_start: Dict[str, dict] = {}

    def owner_bytes(self, gpus: Iterable[int], owner: str) -> int:
        return sum(self.held.get((g, owner), 0) for g in gpus)

    def vram(self, r: dict) -> None:
        """A ``vram`` record (most of the ledger's: :func:`collect` calls this one directly)."""
        gpu, owner = r["gpu"], r["owner"]
        key = (gpu, owner)
        self.held[key] = value = self.held.get(key, 0) + r["delta"]
        if isinstance(owner, str) and owner.endswith("/sync"):
            self.staging.setdefault(owner, {})[gpu] = value

    def feed(self, r: dict, series: Series) -> None:
        kind = r["kind"]
        if kind == "vram":
            self.vram(r)
        elif kind == "rank_state" and r["state"] == "asleep":
            owner = f"{r['pipeline_id']}/dp{r['dp_rank']}"
            _add(series, f"residue_bytes/{owner}", self.owner_bytes(r["gpus"], owner), r["seq"])
        elif "pipeline_id" not in r:
            return
        elif kind == "group_create" and r.get("purpose") == "sync":
            self.open_groups.setdefault(r["pipeline_id"], set()).add(r["name"])
        elif kind == "group_destroy":
            self.open_groups.get(r["pipeline_id"], set()).discard(r["name"])
        elif kind == "sync_start":
            self.sync_start[r["pipeline_id"]] = r
        elif kind == "sync_end":
            self._sync_end(r, series)

    def _sync_end(self, r: dict, series: Series) -> None:
        pid = r["pipeline_id"]
        sync_owner = f"{pid}/sync"
        staged = sum(self.staging.get(sync_owner, {}).values())  # held's values of that owner, in held's order
        _add(series, f"ipc_bytes/{sync_owner}", staged, r["seq"])
        _add(series, f"live_groups/{pid}", len(self.open_groups.get(pid, ())), r["seq"])
        start = self.sync_start.pop(pid, None)
        if start is not None and r["ok"]:
            shape = f"ipc{len(start['ipc_dp_ranks'])}+bcast{len(start['broadcast_dp_ranks'])}"
            _add(series, f"refit_s/{pid}/{shape}", r["t"] - start["t"], r["seq"])


LEDGER_KINDS = ("vram", "rank_state", "group_create", "group_destroy", "sync_start", "sync_end")


def collect(records: Records) -> Tuple[Series, List[Violation]]:
    """Every series of the log, and the ``trend_sample`` records that name no known family."""
    series: Series = {}
    bad: List[Violation] = []
    ledger = _Ledger()
    vram = ledger.vram
    for r in records:
        kind = r["kind"]
        if kind == "vram":
            vram(r)
        elif kind == "trend_sample":
            family = str(r["series"]).split("/", 1)[0]
            if family not in BOUNDS:
                bad.append(
                    Violation(
                        NAME,
                        r["seq"],
                        f"trend_sample series {r['series']!r}: unknown family "
                        f"{family!r} (known: {', '.join(sorted(BOUNDS))})",
                    )
                )
                continue
            _add(
                series,
                r["series"] if "rank" not in r else f"{r['series']}@rank{r['rank']}",
                r["value"],
                r["seq"],
                r["cycle"],
            )
        elif kind in LEDGER_KINDS:
            ledger.feed(r, series)
    return series, bad


def trends(records: Records) -> List[Trend]:
    """Every judged series of the log, in name order (for reports and the gate)."""
    series, _ = collect(records)
    out = [judge(name, samples) for name, samples in sorted(series.items())]
    return [t for t in out if t is not None]


@invariant(NAME, reads=("trend_sample",) + LEDGER_KINDS)
def check_cycle_trends(records: Records) -> List[Violation]:
    """Each series' least-squares slope over its cycles stays within its family's bound."""
    series, out = collect(records)
    for name, samples in sorted(series.items()):
        trend = judge(name, samples)
        if trend is not None and not trend.ok:
            out.append(Violation(NAME, trend.seq, trend.describe()))
    return out
