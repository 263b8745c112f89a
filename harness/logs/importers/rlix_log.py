"""Import RLix's ``[RLIX_SCHED_LOG]`` lines as a replayable input trace.

RLix (``nemo`` branch, docs/rlix-log-format.md) prints one stdout line per scheduler call
for four calls only::

    [RLIX_SCHED_LOG] t=1732400000.123456 fn=request_gpus cluster_id=ppl1_actor_train priority=ACTOR_TRAINING global_step=3 step_target_estimate=None lora_name=None
    [RLIX_SCHED_LOG] t=... fn=report_progress pipeline_id=ppl1 step_target_trajectories=64 completed=12 mode=train
    [RLIX_SCHED_LOG] t=... fn=notify_release_gpus cluster_id=ppl1_actor_train global_step=3
    [RLIX_SCHED_LOG] t=... fn=notify_release_gpus_done cluster_id=ppl1_actor_train released_gpus=[0, 1] idle_gpus_now=[0, 1, 2]

What the log does not carry, and how the importer fills it (the trace says so in its
header's ``meta.import``):

* **Registration** (register, admit, device mappings, tp): from a topology file the user
  gives (``--topology``), every pipeline registered and admitted at t = 0.
* **Cycles**: RLix's central loop wakes on every request and release; the importer puts a
  ``cycle`` after each such input. Its 1 s poll runs a background cycle only when a
  trigger holds (docs/modelled-systems.md#rlix-scheduling-loop-and-background-rebalance); the importer feeds the inputs to the scheduler model as it
  goes and, at each poll tick of log time, adds a ``cycle`` with the trigger as reason
  exactly when the model's :meth:`background_rebalance_reason` says one would run.
* **Not logged at all**: release_then_request, await_release, unregister,
  clear_progress, resize timings. A run that used them imports with those calls missing;
  ``notify_release_gpus_done`` lines are used as a cross-check instead (the GPUs RLix
  says it released against the model's ``released`` decision), and every disagreement
  is reported as a note with its line number.

Times are seconds since the first marker line. Lines without the marker (the rest of
stdout, Ray's prefixes) are passed over; a marker line that cannot be read is an error
naming the line and the field.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import yaml

from harness.logs.records import InputError, Record
from harness.logs.writer import EventLog, header_record
from harness.logs.replay import _Feeder
from harness.scheduler.model import SchedulerModel
from harness.scheduler.options import SchedulerOptions
from harness.scheduler.types import Rejected
from harness.scheduler.topology import ClusterTopology

MARKER = "[RLIX_SCHED_LOG]"
_FIELD = re.compile(r"(\w+)=(\[[^\]]*\]|\S*)")
_FNS = ("request_gpus", "report_progress", "notify_release_gpus", "notify_release_gpus_done")
MAX_LINES = 10_000_000


@dataclass
class ImportResult:
    log: EventLog
    inputs: int = 0  # input records converted from marker lines
    poll_cycles: int = 0  # background cycles the poll added
    notes: List[str] = field(default_factory=list)  # cross-check disagreements, rejected inputs


def _value(raw: str, where: str, name: str, kind: str) -> Any:
    if raw in ("None", ""):
        return None
    try:
        if kind == "int":
            return int(raw)
        if kind == "number":
            x = float(raw)
            if not math.isfinite(x):
                raise ValueError(raw)
            return x
        if kind == "int_list":
            inner = raw.strip("[]").strip()
            return [int(x) for x in inner.split(",")] if inner else []
    except ValueError:
        raise InputError(f"{where}: field {name!r}: not a valid {kind.replace('_', ' ')}: {raw!r}") from None
    return raw


def parse_line(text: str, where: str) -> Optional[Tuple[float, str, Dict[str, str]]]:
    """(t, fn, raw fields) of a marker line, or None for any other line."""
    at = text.find(MARKER)
    if at < 0:
        return None
    fields = dict(_FIELD.findall(text[at + len(MARKER) :]))
    for key in ("t", "fn"):
        if key not in fields:
            raise InputError(f"{where}: field {key!r}: missing from the {MARKER} line")
    if fields["fn"] not in _FNS:
        raise InputError(f"{where}: field 'fn': unknown call {fields['fn']!r}; known: {', '.join(_FNS)}")
    t = _value(fields["t"], where, "t", "number")
    if t is None:
        raise InputError(f"{where}: field 't': missing value")
    return t, fields.pop("fn"), fields


def _require(fields: Dict[str, str], where: str, *names: str) -> None:
    for n in names:
        if fields.get(n) in (None, "", "None"):
            raise InputError(f"{where}: field {n!r}: missing from the {MARKER} line")


def _input(fn: str, f: Dict[str, str], where: str) -> Optional[Dict[str, Any]]:
    """The input record (without seq/t) of one marker line; None for the cross-check line."""
    if fn == "request_gpus":
        _require(f, where, "cluster_id", "priority")
        return {
            "kind": "request",
            "cluster_id": f["cluster_id"],
            "priority": f["priority"],
            "global_step": _value(f.get("global_step", "None"), where, "global_step", "int"),
            "step_target_estimate": _value(f.get("step_target_estimate", "None"), where, "step_target_estimate", "int"),
            "lora_name": _value(f.get("lora_name", "None"), where, "lora_name", "str"),
        }
    if fn == "report_progress":
        _require(f, where, "pipeline_id", "step_target_trajectories", "completed")
        rec = {
            "kind": "progress",
            "pipeline_id": f["pipeline_id"],
            "step_target": _value(f["step_target_trajectories"], where, "step_target_trajectories", "int"),
            "completed": _value(f["completed"], where, "completed", "number"),
        }
        if f.get("mode") not in (None, "", "None"):
            rec["mode"] = f["mode"]
        return rec
    if fn == "notify_release_gpus":
        _require(f, where, "cluster_id")
        return {
            "kind": "release",
            "cluster_id": f["cluster_id"],
            "global_step": _value(f.get("global_step", "None"), where, "global_step", "int"),
        }
    return None


def read_topology(path: str) -> Tuple[Dict[str, int], Dict[str, Dict[str, Any]], Dict[str, Any]]:
    """The topology file: ``cluster: {nodes, gpus_per_node}``, ``pipelines: {id: {cluster_tp_configs,
    cluster_device_mappings[, topology]}}`` and optional ``scheduler:`` options — the fields
    of the ``header`` and ``register`` records (docs/trace-format.md)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise InputError(f"{path}" + (f":{mark.line + 1}" if mark else "") + ": not valid YAML") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping with 'cluster' and 'pipelines'")
    cluster, pipelines = data.get("cluster"), data.get("pipelines")
    if not isinstance(cluster, dict) or not all(
        isinstance(cluster.get(k), int) and cluster[k] > 0 for k in ("nodes", "gpus_per_node")
    ):
        raise InputError(f"{path}: field 'cluster': needs positive integers nodes and gpus_per_node")
    if cluster["nodes"] * cluster["gpus_per_node"] > 65536:
        raise InputError(f"{path}: field 'cluster': at most 65536 GPUs")
    if not isinstance(pipelines, dict) or not pipelines:
        raise InputError(f"{path}: field 'pipelines': a non-empty mapping of pipeline id -> registration")
    for pid, reg in pipelines.items():
        if not isinstance(reg, dict) or not {"cluster_tp_configs", "cluster_device_mappings"} <= set(reg):
            raise InputError(f"{path}: field 'pipelines.{pid}': needs cluster_tp_configs and cluster_device_mappings")
    sched = data.get("scheduler", {})
    if not isinstance(sched, dict):
        raise InputError(f"{path}: field 'scheduler': must be a mapping of scheduler options")
    return {"nodes": cluster["nodes"], "gpus_per_node": cluster["gpus_per_node"]}, pipelines, sched


class _Importer:
    def __init__(self, cluster: Dict[str, int], sched: Dict[str, Any], log_path: str, topo_path: str, poll_s: float):
        try:
            options = SchedulerOptions.from_mapping(sched)
        except ValueError as e:
            raise InputError(f"{topo_path}: field 'scheduler': {e}") from None
        self.model = SchedulerModel(ClusterTopology(cluster["nodes"], cluster["gpus_per_node"]), options)
        meta = {
            "import": "rlix-log",
            "log": log_path,
            "topology": topo_path,
            "poll_s": poll_s,
            "filled_in": "register/admit at t=0 from the topology; a cycle after each request and release; "
            "poll cycles where the model's background trigger holds",
            "not_in_log": "release_then_request, await_release, unregister, clear_progress, resize timings",
        }
        self.result = ImportResult(
            EventLog(header_record(cluster, scheduler=options.to_mapping(), source="rlix-log", meta=meta))
        )
        self.feeder = _Feeder(self.model, log_path)
        self.poll_s = poll_s
        self.next_poll = poll_s
        self.released: Dict[str, List[int]] = {}  # cluster -> GPUs of the model's last release

    def add(self, t: float, line: int, rec: Dict[str, Any]) -> None:
        """Append an input record and feed it to the model, as replay will."""
        log = self.result.log
        stamped = log.append(rec["kind"], t, {k: v for k, v in rec.items() if k != "kind"})
        try:
            self.feeder.feed(Record(line, stamped))
        except Rejected as e:
            self.model.drain()
            self.result.notes.append(f"line {line}: RLix's {rec['kind']} is refused by the model: {e.reason}")
            return
        for d in self.model.drain():
            if d["kind"] == "released":
                self.released[d["cluster_id"]] = sorted(d["gpus"])

    def poll_until(self, t: float, line: int) -> None:
        """The 1 s poll ticks before ``t``: a background cycle where a trigger holds."""
        while self.next_poll <= t:
            reason = self.model.background_rebalance_reason()
            if reason is not None:
                self.add(self.next_poll, line, {"kind": "cycle", "reason": f"background:{reason}"})
                self.result.poll_cycles += 1
            self.next_poll += self.poll_s

    def cross_check(self, fields: Dict[str, str], where: str, line: int) -> None:
        _require(fields, where, "cluster_id")
        cid = fields["cluster_id"]
        said = sorted(_value(fields.get("released_gpus", "[]"), where, "released_gpus", "int_list") or [])
        model = self.released.pop(cid, None)
        if model is None:
            self.result.notes.append(f"line {line}: RLix released {said} from {cid}; the model released nothing for it")
        elif model != said:
            self.result.notes.append(f"line {line}: RLix released {said} from {cid}; the model released {model}")


def import_rlix_log(log_path: str, topology_path: str, *, poll_s: float = 1.0) -> ImportResult:
    cluster, pipelines, sched = read_topology(topology_path)
    imp = _Importer(cluster, sched, log_path, topology_path, poll_s)
    for pid, reg in pipelines.items():
        register = {
            "kind": "register",
            "pipeline_id": str(pid),
            "cluster_tp_configs": reg["cluster_tp_configs"],
            "cluster_device_mappings": reg["cluster_device_mappings"],
        }
        if "topology" in reg:
            register["topology"] = reg["topology"]
        imp.add(0.0, 0, register)
        imp.add(0.0, 0, {"kind": "admit", "pipeline_id": str(pid)})
    t0: Optional[float] = None
    try:
        fh = open(log_path, encoding="utf-8", errors="strict")
    except IsADirectoryError:
        raise InputError(f"{log_path}: is a directory") from None
    with fh:
        n = 0
        while True:
            where = f"{log_path}:{n + 1}"
            try:
                text = fh.readline(1 << 20)
            except UnicodeDecodeError:
                raise InputError(f"{where}: not UTF-8 text") from None
            if not text:
                break
            n += 1
            if n > MAX_LINES:
                raise InputError(f"{log_path}: more than {MAX_LINES} lines")
            parsed = parse_line(text, where)
            if parsed is None:
                continue
            t_abs, fn, fields = parsed
            t0 = t_abs if t0 is None else t0
            t = round(t_abs - t0, 6)
            if t < imp.result.log.records[-1]["t"]:
                raise InputError(
                    f"{where}: field 't': {t_abs} is earlier than the line before (the log must be in time order)"
                )
            imp.poll_until(t, n)
            if fn == "notify_release_gpus_done":
                imp.cross_check(fields, where, n)
                continue
            rec = _input(fn, fields, where)
            imp.add(t, n, rec)
            imp.result.inputs += 1
            if rec["kind"] in ("request", "release"):
                imp.add(t, n, {"kind": "cycle", "reason": "wakeup"})
    if t0 is None:
        raise InputError(f"{log_path}: no {MARKER} line found")
    return imp.result
