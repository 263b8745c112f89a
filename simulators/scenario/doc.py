"""Generate ``docs/scenario-reference.md`` from the spec: every field, unit, default, limit.

The reference is derived, never written by hand, from the three places that define a
scenario: the dataclasses of ``simulators/scenario/spec.py`` and ``fault_catalogue.py``
(fields, defaults and the comment on each field), the validation table of ``simulators/scenario/rules.py`` (type, bound, unit)
and the size limits of ``harness/limits.py``; scheduler options come from
``harness.scheduler.options.SchedulerOptions``; the list of bundled scenarios (the one
count the docs give) from ``examples/scenarios/``. A test regenerates it and compares, so
the shipped file cannot fall behind the code::

    python -m simulators.scenario.doc --write     # regenerate docs/scenario-reference.md
    python -m simulators.scenario.doc --check     # exit 1 if the file is out of date
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import io
import os
import re
import sys
import tokenize
from typing import Dict, List, Optional, Tuple

from harness import limits
from harness.scheduler.options import SchedulerOptions
from harness.scheduler.policies import POLICIES
from simulators.scenario import spec
from simulators.pipelines.dataplane import DataPlaneSpec
from simulators.scenario.limits import NAME_RULE
from simulators.scenario.rules import FIELD_RULES, Rule

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC_PATH = os.path.join(_ROOT, "docs", "scenario-reference.md")
SCENARIO_DIR = os.path.join(_ROOT, "examples", "scenarios")

_BOUND_TEXT = {"": "", ">0": "> 0", ">=0": ">= 0", ">=1": ">= 1", "(0,1]": "in (0, 1]"}

#: field path -> the size limit that applies to it (beyond its bound)
_LIMITS: Dict[str, str] = {
    "cluster.nodes": f"nodes x gpus_per_node <= {limits.fmt_limit(limits.MAX_GPUS)} GPUs",
    "cluster.gpus_per_node": f"nodes x gpus_per_node <= {limits.fmt_limit(limits.MAX_GPUS)} GPUs",
    "horizon_s": f"<= {limits.fmt_limit(limits.MAX_HORIZON_S)} s (30 days)",
    "name": NAME_RULE,
    "pipelines": f"<= {limits.fmt_limit(limits.MAX_PIPELINES)} pipelines; steps x trajectories per step summed over "
    f"pipelines <= {limits.fmt_limit(limits.MAX_TRAJECTORIES_PER_RUN)}",
    "pipelines[].steps": f"<= {limits.fmt_limit(limits.MAX_STEPS)}",
    "workload.prompts_per_step": f"prompts_per_step x generations_per_prompt <= {limits.fmt_limit(limits.MAX_TRAJECTORIES_PER_STEP)}",
    "workload.generations_per_prompt": f"prompts_per_step x generations_per_prompt <= {limits.fmt_limit(limits.MAX_TRAJECTORIES_PER_STEP)}",
    "workload.decode_tokens_max": f"<= {limits.fmt_limit(limits.MAX_DECODE_TOKENS)}",
    "workload.max_concurrent_per_rank": f"<= {limits.fmt_limit(limits.MAX_CONCURRENT_PER_RANK)}",
}

_ALLOWED = {
    "streaming.sampler": "in_order, weight_fifo, windowed, ready_first or custom",
    "streaming.stall_action": "warn or abort",
    "streaming.custom_target": "module:Class (sampler custom only)",
    "data_plane.route": "one_hop or via_driver",
    "disaggregated.shape": "sync, one_step_off or fully_async",
    "disaggregated.weight_sync": "drain, pause or in_flight (fully_async)",
    "disaggregated.batching": "completion or target (fully_async)",
    "disaggregated.comm_locks": "true or false (one_step_off)",
    "weight_sync_groups.join_order": "concurrent or phased",
    "weight_sync_groups.receiver_slot": "single or per_group",
    "pipelines[].sleep_level": "1 (weights kept in host RAM) or 2 (weights dropped)",
    "pipelines[].pause_mode": "abort, wait or keep",
    "pipelines[].wake": "all or staged",
    "pipelines[].wait_offloaded": "true or false",
    "pipelines[].finalize_pause": "none, continue_after or continue_finally",
    "pipelines[].weights_memo": "true or false",
    "pipelines[].refit_path": "cpu_cache or colocated_ipc (colocated_ipc: every infer GPU a train GPU, and cluster.gpu)",
    "pipelines[].refit_export": "megatron_bridge or gather_params",
    "workload.decode_timing": "at_start or per_step",
    "workload.decode_tokens_cap_share": ">= 0, below 1",
    "workload.decode_tokens_sigma": ">= 0, at most 10",
    "workload.decode_expert_read_s": "per_step only; needs model.num_experts and model.experts_per_token; <= batching_half_point / tokens_per_s_per_rank",
    "workload.decode_kv_s_per_token": "per_step only; times the mean context <= the per-sequence step (1 / tokens_per_s_per_rank)",
    "model.num_experts": ">= experts_per_token",
    "pipelines[].type": " or ".join(spec.PIPELINE_TYPES),
    "faults[].name": "a fault name (list below)",
    "faults[].pipeline": "a pipeline's name",
    "faults[].at_step": ">= 0, below the pipeline's steps",
}

_MEANING = {
    "pipelines[].streaming": "mapping: the single controller's knobs (table below); single_controller only",
    "pipelines[].data_plane": "mapping: bulk tensors through a store (table below); absent: no data plane",
    "pipelines[].weight_sync_groups": "mapping: the weight-sync groups' rendezvous and first broadcast before the first step (table below); absent: not modelled",
    "weight_sync_groups.join_order": "concurrent: every PP stage's joins go out at once (slime before #2331); phased: stage s+1's once stage s's group exists",
    "weight_sync_groups.receiver_slot": "single: an engine keeps one receiver communicator, the last init wins (vime before #329); per_group: one per stage",
    "weight_sync_groups.engine_exits": "engine 0 dies just before its first receive (the receiver-died field reports)",
    "streaming.min_groups_for_streaming_train": "prompt groups the trainer waits for before a microbatch; = workload.prompts_per_step is the non-streaming controller",
    "streaming.max_inflight_prompts": "prompts being generated at once (the in-flight semaphore)",
    "streaming.max_buffered_rollouts": "prompt groups the buffer holds (the capacity semaphore); a gated sampler needs prompts_per_step x (window + 1)",
    "streaming.max_infra_attempts_per_prompt": "attempts of one prompt after infrastructure failures",
    "streaming.max_data_attempts_per_prompt": "attempts of one prompt after data failures, then it is skipped",
    "streaming.watchdog_interval_s": "how often the stall watchdog looks",
    "streaming.stall_timeout_s": "no progress for this long is a stall; must be above watchdog_interval_s",
    "streaming.drop_budgets": "true: NeMo RL's drop budgets apply (a drop past them, or a step below its floor, fails the run); false: drops are unlimited",
    "streaming.max_skipped_prompts": "with drop_budgets: prompts that may be dropped after data failures; 0 fails on the first; above 0 only with in_order (or custom)",
    "streaming.max_consecutive_dropped_prompts": "with drop_budgets: prompts in a row that may be dropped after infra failures (a commit resets the count)",
    "streaming.min_step_batch_fraction": "with drop_budgets: a step closing below ceil(fraction x prompts_per_step) groups fails the run",
    "streaming.on_dropped_prompt": "shrink: a step whose stamped prompt was dropped closes on fewer groups; replace: a spare prompt from a pool (refilled by diverting whole batches) takes the slot, after re-stamping a later step's finished group into the short step when there is one (in_order or custom only)",
    "streaming.max_replacement_attempts": "with replace: spare prompts tried for one lost slot before the step shrinks (>= 1)",
    "streaming.replacement_reserve_prompts": "with replace: the spare pool's low-water mark; below it the next batch is diverted into the pool instead of admitted (>= 1)",
    "streaming.checkpoint_restore_after_steps": "after this many finished steps the rollout buffer is checkpointed (finished groups, spare pool), the process lost (in-flight rollouts gone) and the run resumed from it, topping up restored steps; 0 = never; below steps",
    "workload.decode_timing": "at_start: a request's decode time is fixed when it starts, at the concurrency it finds; per_step: every decode step is charged at that step's concurrency, t(c) = (batching_half_point + c) / tokens_per_s_per_rank (continuous batching: a batch's last sequences decode at the low-batch step time); the cost model derives per_step with its curve (docs/cost-model.md)",
    "workload.decode_expert_read_s": "seconds of a full-concurrency decode step spent reading the routed experts' weights; a step of c sequences skips the share (1 - k/E)^c of them (k = model.experts_per_token, E = model.num_experts); derived by the cost model",
    "model.num_experts": "routed experts per MoE layer (config.json's num_experts); 0 = dense or not given",
    "name": "the scenario's name; also its run folder, runs/<name>",
    "description": "free text, shown nowhere but the resolved scenario.yaml",
    "seed": "random seed of the workload (decode lengths); same scenario + seed = same event log",
    "pipelines[].name": "pipeline id (RLix's rules: letters, digits, '_' and '-')",
    "pipelines[].infer_tp": "tensor parallelism of one inference DP rank",
    "pipelines[].steps": "training steps the pipeline runs",
    "pipelines[].sleep_level": "vLLM sleep level of the inference ranks (RLix's default 2; standalone NeMo RL sleeps at 1; docs/engine-lifecycle.md)",
    "pipelines[].pause_mode": "what a shrink's pause does to the requests a rank holds: abort them (RLix's sleep_partial), wait for them, or keep them frozen until the rank resumes (docs/engine-lifecycle.md)",
    "pipelines[].wait_offloaded": "RLix's MILES wait after the training grant (rlops/rlix PR #11): poll the engines until offloaded, then the GPUs until the largest used memory is at most costs.max_residual_gpu_mem_bytes, each within costs.offload_wait_timeout_s; on the second timeout warn and train anyway (docs/engine-lifecycle.md)",
    "pipelines[].weights_memo": "the engine keeps a memo in its weights' memory region (SGLang's MXFP8 MoE shuffle indices): each finalize's post-load processing reads it, each weight load drops it (sgl-project/sglang PR #28676; fault memo_not_invalidated: the load keeps it; docs/engine-lifecycle.md)",
    "pipelines[].finalize_pause": "RLix's MILES pause of the serving ranks around the active refresh's finalize (rlops/rlix PR #14): none (RLix nemo), continue_after (continue_generation only after a finalize that returned) or continue_finally (in a finally: the fix; docs/engine-lifecycle.md)",
    "pipelines[].wake": "all: one wake of every memory tag before the refit (RLix); staged: weights before the refit, the KV cache after finalize (vLLM's RL sequence)",
    "pipelines[].refit_path": "cpu_cache: RLix's refit, a host-RAM bucket cache built after training, synced from it; colocated_ipc: standalone NeMo RL's, each trainer GPU hands its weights to the vLLM worker on the same GPU by CUDA IPC, group by group, no cache (docs/cost-model.md)",
    "pipelines[].refit_export": "how NeMo RL's refit gathers each tensor whole from the training layout before the colocated_ipc hand-over (the cost model's costs.refit_gather_s): megatron_bridge, NeMo RL v0.4 on (Megatron-Bridge's export: the TP shard crosses the pipeline stages, then the TP all-gather); gather_params, v0.3 (the TP all-gather first, then the whole tensor crosses the stages); docs/cost-model.md",
    "cluster.nodes": "nodes in the cluster",
    "cluster.gpus_per_node": "GPUs per node",
    "faults[].name": "which fault (list below)",
    "faults[].pipeline": "the pipeline it hits",
    "faults[].at_step": "the step (0-based) it hits at, or from",
}

_STRUCTURED = {
    "cluster": "mapping: the cluster (table below)",
    "costs": "mapping: cost parameters (table below); every one optional",
    "scheduler": "mapping: scheduler options (table below); every one optional",
    "pipelines": "list of mappings: the pipelines (table below); at least one",
    "faults": "list of mappings: fault hooks (table below)",
    "train_gpus": "list of GPU ids: the training cluster (one training rank per GPU)",
    "infer_gpus": "list of GPU ids: the inference cluster; DP rank r is sorted(infer_gpus)[r*tp:(r+1)*tp]",
    "model": "mapping: the model (table below); overrides `defaults.model`",
    "workload": "mapping: the workload (table below); overrides `defaults.workload`",
}


def field_comments(cls: type) -> Dict[str, str]:
    """The comment of each field of a dataclass: its trailing ``# ...`` or, failing that,
    the comment lines just above it."""
    source = inspect.getsource(cls)
    comments: Dict[str, str] = {}
    pending: List[str] = []
    line_fields: Dict[int, str] = {}
    for i, line in enumerate(source.splitlines(), start=1):
        m = re.match(r"^    (\w+)\s*:", line)
        if m:
            line_fields[i] = m.group(1)
    above: Dict[str, List[str]] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row = tok.start[0]
            text = tok.string.lstrip("#").strip()
            if row in line_fields:
                comments[line_fields[row]] = text
            else:
                pending.append(text)
        elif tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            continue
        elif tok.start[0] in line_fields:
            name = line_fields[tok.start[0]]
            if pending and name not in above:
                above[name] = pending
            pending = []
        else:
            pending = []
    for name, lines in above.items():
        comments.setdefault(name, " ".join(lines))
    return comments


def _default(cls: type, f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(value):
            return "(table below)"
    else:
        return "required"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        return repr(value) if value else '""'
    if value is None or (isinstance(value, (dict, tuple, list)) and not value):
        return "none"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(cls: type, prefix: str, limit_prefix: str, extra_rows: Optional[List[Tuple[str, ...]]] = None) -> List[str]:
    rules: Dict[str, Rule] = FIELD_RULES.get(cls, {})
    comments = field_comments(cls)
    rows = ["| field | type | unit | default | allowed | limit | meaning |", "|---|---|---|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        rule = rules.get(f.name)
        kind = rule.kind if rule else "structured"
        unit = rule.unit if rule else ""
        key = f"{limit_prefix}{f.name}"
        allowed = _ALLOWED.get(key) or (_BOUND_TEXT[rule.bound] if rule else "")
        meaning = _MEANING.get(key) or comments.get(f.name, "") or _STRUCTURED.get(f.name, "")
        limit = _LIMITS.get(key, "")
        if kind == "float" and not limit:
            limit = "finite"
        rows.append(
            "| "
            + " | ".join(
                _cell(x) for x in (f"`{prefix}{f.name}`", kind, unit, _default(cls, f), allowed, limit, meaning)
            )
            + " |"
        )
    for row in extra_rows or []:
        rows.append("| " + " | ".join(_cell(x) for x in row) + " |")
    return rows


def _scheduler_table() -> List[str]:
    comments = field_comments(SchedulerOptions)
    rows = ["| field | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    policy_rows = {  # the policy's own fields (docs/policies.md): kind and allowed values
        "policy": ("str", " / ".join(POLICIES)),
        "partition": (
            "map",
            "pipeline -> list of GPU ids; disjoint; each pipeline's training GPUs and one whole "
            "inference bundle inside its part",
        ),
        "groups": ("list", "lists of pipeline names; a pipeline in at most one"),
    }
    for f in dataclasses.fields(SchedulerOptions):
        default = f.default
        kind = "bool" if isinstance(default, bool) else "int" if isinstance(default, int) else "float"
        allowed = {"bool": "true / false", "int": "> 0", "float": ">= 0"}[kind]
        if f.name in policy_rows:
            kind, allowed = policy_rows[f.name]
        rows.append(
            "| "
            + " | ".join(
                _cell(x)
                for x in (
                    f"`scheduler.{f.name}`",
                    kind,
                    _default(SchedulerOptions, f),
                    allowed,
                    comments.get(f.name, ""),
                )
            )
            + " |"
        )
    rows.append(
        "| `scheduler.implementation` | str | 'model' | model / rlix | Which scheduler decides: the model, or RLix's "
        "own scheduler imported from `scheduler.source` (docs/rlix-live.md); the options above still configure "
        "the model's bookkeeping. |"
    )
    rows.append(
        "| `scheduler.source` | str | none | an RLix checkout (the folder holding rlix/); implementation rlix only | "
        "Checked before the run: an RLix whose interfaces changed is one error line naming what is missing. |"
    )
    return rows


def _fault_list() -> List[str]:
    doc = inspect.getdoc(spec.FaultSpec) or ""
    bullets = [line for line in doc.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(bullets) if line.startswith("*")), len(bullets))
    return bullets[start:]


def _expect_table() -> List[str]:
    """The ``expect:`` list's fields (harness.logs.expect), which no dataclass of the spec holds."""
    rows = [
        (
            "`check`",
            "string (glob)",
            "required",
            "an oracle check name (`rlharness check` lists them) or a run outcome "
            "(`oom:*`, `timeout:*`, `horizon:*`, `failed:*`, `plan_validation:*`, `scheduler_failed:*`)",
        ),
        ("`reason`", "string", "required", "why the finding is expected (shown in every report)"),
        ("`pipeline`", "string (glob)", "any", "a pipeline name or type the finding names"),
        ("`cluster`", "string (glob)", "any", "a cluster id the finding names (`<pipeline>_actor_infer`)"),
        ("`after_fault`", "string (glob)", "any", "a fault that fired before the finding"),
    ]
    out = [
        "Findings this scenario is known to produce (docs/expected-findings.md): a finding an entry "
        "matches is reported as expected and does not fail the run; an entry that matches nothing is "
        "reported, and fails the run under `--strict`. `*` and `?` are wildcards.",
        "",
        "| field | type | default | meaning |",
        "|---|---|---|---|",
    ]
    return out + [f"| {' | '.join(r)} |" for r in rows]


def bundled_scenario_files() -> List[str]:
    """The bundled scenarios: every ``*.yaml`` of ``examples/scenarios/``, sorted."""
    return sorted(f for f in os.listdir(SCENARIO_DIR) if f.endswith(".yaml"))


def _first_sentence(path: str) -> str:
    """What a bundled scenario is for: the first sentence of its leading comment block."""
    lines: List[str] = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.startswith("#"):
                break
            lines.append(line.lstrip("#").strip())
    text = " ".join(x for x in lines if x)
    text = re.sub(r"\s*\(docs/modelled-systems\.md#[\w-]+\)|,? docs/modelled-systems\.md#[\w-]+", "", text)
    m = re.match(r"(.+?[a-z0-9)`][.])(\s|$)", text)
    sentence = m.group(1) if m else text
    return sentence if len(sentence) <= 220 else sentence[:217].rstrip() + "..."


def _bundled_scenarios() -> List[str]:
    """The one count and list of bundled scenarios the docs point to (generated, so it
    cannot disagree with the folder)."""
    files = bundled_scenario_files()
    out = [
        "## Bundled scenarios",
        "",
        f"`examples/scenarios/` holds {len(files)} scenarios; each reproduces a failure mode, shows a fix "
        "or answers a question (its leading comment says which; the checks that catch each "
        "failure mode are in [simulator.md](simulator.md#failure-modes-and-the-checks-that-catch-them)).",
        "",
        "| scenario | what it is for |",
        "|---|---|",
    ]
    for f in files:
        out.append(f"| [`{f}`](../examples/scenarios/{f}) | {_cell(_first_sentence(os.path.join(SCENARIO_DIR, f)))} |")
    return out + [""]


def render() -> str:
    out: List[str] = [
        "# Scenario reference",
        "",
        "<!-- generated by `python -m simulators.scenario.doc --write` from simulators/scenario/spec.py, "
        "simulators/scenario/rules.py and harness/limits.py; do not edit by hand -->",
        "",
        "A scenario is a YAML file (examples in [examples/scenarios/](../examples/scenarios)); "
        "`rlharness validate FILE` checks one without running it. Sizes are bytes, bandwidths "
        "bytes/second, times simulated seconds. *allowed* is the bound every value must meet, "
        "*limit* the size limit that keeps a run within memory (exceeding either is one error "
        "line naming the field, exit code 2). Unknown fields are errors; integers are 64-bit; "
        f"files are at most {limits.fmt_limit(limits.MAX_SCENARIO_BYTES)} bytes and nest at most "
        f"{limits.MAX_NESTING} levels.",
        "",
        "## Top level",
        "",
    ]
    out += _table(
        spec.Scenario,
        "",
        "",
        extra_rows=[
            (
                "`defaults`",
                "structured",
                "",
                "none",
                "",
                "",
                "mapping with `model` and/or `workload`: applied to every pipeline first",
            ),
        ],
    )
    out += ["", "## `expect[]`", ""] + _expect_table()
    out += ["", "## `cluster`", ""] + _table(spec.ClusterSpec, "cluster.", "cluster.")
    out += ["", "## `pipelines[]`", ""] + _table(spec.PipelineSpec, "", "pipelines[].")
    out += ["", "## `model` (in a pipeline or `defaults`)", ""] + _table(spec.ModelSpec, "model.", "model.")
    out += ["", "## `workload` (in a pipeline or `defaults`)", ""] + _table(spec.WorkloadSpec, "workload.", "workload.")
    out += ["", "## `streaming` (in a `single_controller` pipeline)", ""] + _table(
        spec.StreamingSpec, "streaming.", "streaming."
    )
    out += ["", "## `disaggregated` (in a `disaggregated` pipeline)", ""] + _table(
        spec.DisaggregatedSpec, "disaggregated.", "disaggregated."
    )
    out += ["", "## `data_plane` (in a pipeline)", ""] + _table(DataPlaneSpec, "data_plane.", "data_plane.")
    out += ["", "## `weight_sync_groups` (in a nemo_async or roll_sync pipeline)", ""] + _table(
        spec.WeightSyncGroupsSpec, "weight_sync_groups.", "weight_sync_groups."
    )
    out += ["", "## `costs`", ""] + _table(spec.CostSpec, "costs.", "costs.")
    out += ["", "## `scheduler`", ""] + _scheduler_table()
    out += ["", "## `faults[]`", ""] + _table(spec.FaultSpec, "", "faults[].")
    out += ["", f"Fault names ({', '.join(f'`{n}`' for n in spec.FAULT_NAMES)}):", ""] + _fault_list()
    out += ["", f"Pipeline types: {', '.join(f'`{t}`' for t in spec.PIPELINE_TYPES)}.", ""]
    out += _bundled_scenarios()
    return "\n".join(out)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulators.scenario.doc", description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help=f"write {os.path.relpath(DOC_PATH)}")
    group.add_argument("--check", action="store_true", help="exit 1 if the shipped file differs")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        from harness.logs.writer import atomic_write

        atomic_write(DOC_PATH, text)
        print(f"wrote {DOC_PATH}")
        return 0
    if args.check:
        try:
            with open(DOC_PATH, encoding="utf-8") as fh:
                current = fh.read()
        except OSError:
            current = None
        if current != text:
            print(f"{DOC_PATH} is out of date: run python -m simulators.scenario.doc --write", file=sys.stderr)
            return 1
        print(f"{DOC_PATH} is current")
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
