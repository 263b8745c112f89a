"""``rlharness import rlix-log``: RLix's ``[RLIX_SCHED_LOG]`` lines (docs/rlix-log-format.md)
become an input trace that replays through the scheduler model.

The log excerpt is written from the documented line format (a 2-GPU NeMo partial-overlap
run: init, a GENERATION request, progress, a training step that preempts the overlap
rank), with the stdout noise a real run has around the marker lines."""

from __future__ import annotations

import json

import pytest

from rlharness.cli import main
from harness.logs.importers.rlix_log import import_rlix_log
from harness.logs.replay import replay_file

TOPOLOGY = """\
cluster: {nodes: 1, gpus_per_node: 2}
pipelines:
  ppl1:
    topology: partial_overlap
    cluster_tp_configs: {actor_train: 1, actor_infer: 1}
    cluster_device_mappings: {actor_train: [0], actor_infer: [0, 1]}
"""

LOG = """\
(Pipeline pid=4242) INFO starting pipeline ppl1
[RLIX_SCHED_LOG] t=1732400000.000000 fn=request_gpus cluster_id=ppl1_actor_train priority=INITIALIZATION global_step=None step_target_estimate=None lora_name=None
(Pipeline pid=4242) [RLIX_SCHED_LOG] t=1732400002.000000 fn=notify_release_gpus cluster_id=ppl1_actor_train global_step=None
[RLIX_SCHED_LOG] t=1732400002.000100 fn=notify_release_gpus_done cluster_id=ppl1_actor_train released_gpus=[0] idle_gpus_now=[0, 1]
[RLIX_SCHED_LOG] t=1732400002.100000 fn=request_gpus cluster_id=ppl1_actor_infer priority=GENERATION global_step=0 step_target_estimate=8 lora_name=None
some other stdout line
[RLIX_SCHED_LOG] t=1732400004.000000 fn=report_progress pipeline_id=ppl1 step_target_trajectories=8 completed=2 mode=train
[RLIX_SCHED_LOG] t=1732400009.500000 fn=report_progress pipeline_id=ppl1 step_target_trajectories=8 completed=8 mode=train
[RLIX_SCHED_LOG] t=1732400009.600000 fn=request_gpus cluster_id=ppl1_actor_train priority=ACTOR_TRAINING global_step=0 step_target_estimate=None lora_name=None
[RLIX_SCHED_LOG] t=1732400015.000000 fn=notify_release_gpus cluster_id=ppl1_actor_train global_step=0
[RLIX_SCHED_LOG] t=1732400015.000100 fn=notify_release_gpus_done cluster_id=ppl1_actor_train released_gpus=[0] idle_gpus_now=[0]
"""


@pytest.fixture
def files(tmp_path):
    topo, log = tmp_path / "topology.yaml", tmp_path / "rlix.out"
    topo.write_text(TOPOLOGY)
    log.write_text(LOG)
    return tmp_path, str(log), str(topo)


def test_the_imported_trace_replays_through_the_model(files):
    tmp, log, topo = files
    res = import_rlix_log(log, topo)
    assert res.notes == []  # RLix's released GPUs agree with the model's
    kinds = [r["kind"] for r in res.log.records]
    assert kinds[:3] == ["header", "register", "admit"]
    assert res.inputs == 7 and kinds.count("request") == 3 and kinds.count("release") == 2
    assert kinds.count("progress") == 2
    assert res.log.records[0]["meta"]["not_in_log"].startswith("release_then_request")
    times = [r["t"] for r in res.log.records]
    assert times == sorted(times) and res.log.records[-1]["t"] == 15.0

    out = tmp / "trace.jsonl"
    out.write_text("".join(line + "\n" for line in res.log.lines()))
    replay = replay_file(str(out))
    assert replay.rejected == 0
    signalled = [(d["cluster_id"], d["gpus"]) for d in replay.decisions if d["kind"] == "signalled"]
    assert ("ppl1_actor_train", [0]) in signalled
    # the training request preempts the overlap rank (dp0 on GPU 0) of the GENERATION cluster
    shrinks = [s for d in replay.decisions if d["kind"] == "plan" for s in d["shrinks"]]
    assert any(s["cluster_id"] == "ppl1_actor_infer" and s["bundles"][0]["gpus"] == [0] for s in shrinks)


def test_a_release_that_disagrees_with_the_model_is_a_note_with_its_line(files):
    tmp, log, topo = files
    with open(log, "a") as fh:
        fh.write(
            "[RLIX_SCHED_LOG] t=1732400016.0 fn=notify_release_gpus_done cluster_id=ppl1_actor_infer "
            "released_gpus=[1] idle_gpus_now=[0, 1]\n"
        )
    text = (
        open(log).read().replace("released_gpus=[0] idle_gpus_now=[0, 1]", "released_gpus=[0, 1] idle_gpus_now=[0, 1]")
    )
    open(log, "w").write(text)
    notes = import_rlix_log(log, topo).notes
    assert notes == [
        "line 4: RLix released [0, 1] from ppl1_actor_train; the model released [0]",
        "line 12: RLix released [1] from ppl1_actor_infer; the model released nothing for it",
    ]


def test_the_poll_adds_a_background_cycle_only_where_a_trigger_holds(tmp_path):
    # training takes the whole GENERATION mapping: the GEN cluster is suspended with demand
    # left (2 of 8 collected), so RLix's 1 s poll runs a background cycle (trigger 2.2)
    topo = tmp_path / "t.yaml"
    topo.write_text(
        TOPOLOGY.replace("topology: partial_overlap", "{}")
        .replace("    {}\n", "")
        .replace("actor_train: [0]", "actor_train: [0, 1]")
    )
    log = tmp_path / "l.out"
    log.write_text(
        LOG.split("[RLIX_SCHED_LOG] t=1732400009.5")[0]
        + "[RLIX_SCHED_LOG] t=1732400009.6 fn=request_gpus cluster_id=ppl1_actor_train priority=ACTOR_TRAINING global_step=0\n"
        + "[RLIX_SCHED_LOG] t=1732400012.5 fn=report_progress pipeline_id=ppl1 step_target_trajectories=8 completed=2\n"
    )
    res = import_rlix_log(str(log), str(topo))
    polls = [r for r in res.log.records if r["kind"] == "cycle" and r["reason"].startswith("background")]
    assert [(r["t"], r["reason"]) for r in polls] == [
        (10.0, "background:2.2"),
        (11.0, "background:2.2"),
        (12.0, "background:2.2"),
    ]
    assert res.poll_cycles == 3
    before = import_rlix_log(str(log), str(topo), poll_s=1000.0)
    assert before.poll_cycles == 0


def test_cli_writes_the_trace_and_replay_accepts_it(files, capsys):
    tmp, log, topo = files
    out = tmp / "trace.jsonl"
    assert main(["import", "rlix-log", log, "--topology", topo, "--out", str(out)]) == 0
    assert "imported" in capsys.readouterr().out
    assert json.loads(out.read_text().splitlines()[0])["source"] == "rlix-log"
    assert main(["replay", str(out), "--quiet"]) == 0


@pytest.mark.parametrize(
    "line, message",
    [
        (
            "[RLIX_SCHED_LOG] t=1732400020 fn=request_gpus cluster_id=ppl1_actor_train priority=GENERATION global_step=x",
            "rlix.out:12: field 'global_step': not a valid int: 'x'",
        ),
        ("[RLIX_SCHED_LOG] fn=request_gpus cluster_id=ppl1_actor_train", "rlix.out:12: field 't': missing"),
        ("[RLIX_SCHED_LOG] t=1732400020 fn=kill_pipeline", "rlix.out:12: field 'fn': unknown call 'kill_pipeline'"),
        (
            "[RLIX_SCHED_LOG] t=1732300000 fn=report_progress pipeline_id=ppl1 step_target_trajectories=8 completed=1",
            "rlix.out:12: field 't': 1732300000.0 is earlier than the line before",
        ),
        (
            "[RLIX_SCHED_LOG] t=1732400020 fn=report_progress pipeline_id=ppl1 completed=1",
            "rlix.out:12: field 'step_target_trajectories': missing",
        ),
    ],
)
def test_a_bad_marker_line_is_one_error_line_naming_line_and_field(files, capsys, line, message):
    tmp, log, topo = files
    with open(log, "a") as fh:
        fh.write(line + "\n")
    out = tmp / "trace.jsonl"
    assert main(["import", "rlix-log", log, "--topology", topo, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not out.exists()


def test_bad_topology_and_arguments_exit_2(files, capsys):
    tmp, log, topo = files
    bad = tmp / "bad.yaml"
    bad.write_text("cluster: {nodes: 0, gpus_per_node: 2}\npipelines: {}\n")
    assert main(["import", "rlix-log", log, "--topology", str(bad), "--out", str(tmp / "o.jsonl")]) == 2
    assert "field 'cluster'" in capsys.readouterr().err
    assert main(["import", "rlix-log", log, "--topology", topo, "--out", log]) == 2
    assert "is an input of this command" in capsys.readouterr().err
    empty = tmp / "empty.out"
    empty.write_text("nothing here\n")
    assert main(["import", "rlix-log", str(empty), "--topology", topo, "--out", str(tmp / "o.jsonl")]) == 2
    assert "no [RLIX_SCHED_LOG] line found" in capsys.readouterr().err
