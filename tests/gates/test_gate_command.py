"""``rlharness gate NAME``: the gate's verdict in plain words and the gate's exit code.

Under bare torchrun a usage error, a skip or a designed failure ends in torchrun's
``ChildFailedError`` traceback and exit 1. Through ``rlharness gate`` a usage error is one
line before anything is launched (exit 2), and a pass, a failure (the ``leak_group``
fault hook) and a skip print the verdict from the report with the gate's exit code (0,
1, 3); torchrun's own output goes to the launch log only.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from rlharness import gate as gate_cmd  # noqa: E402
from harness.exit_codes import ExitCode  # noqa: E402
from tests.cli.test_cli_error_contract import run_error  # noqa: E402
from tests.gates.conftest import HOOK_ENV, REPO, _one_gate_at_a_time, lane_of  # noqa: E402

pytestmark = pytest.mark.gate


def _rlharness(tmp_path, request, *argv, hook=None, timeout_s=180):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop(HOOK_ENV, None)
    if hook:
        env[HOOK_ENV] = hook
    with _one_gate_at_a_time(tmp_path, lane_of(request.node)):
        proc = subprocess.run(
            [sys.executable, "-m", "rlharness", "gate", *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            start_new_session=True,
        )
    return proc


def _no_torchrun_noise(proc):
    for stream in (proc.stdout, proc.stderr):
        assert "Traceback" not in stream and "ChildFailedError" not in stream, stream[-3000:]


def test_a_passing_gate_prints_its_verdict(tmp_path, request):
    report = tmp_path / "out" / "t.json"
    proc = _rlharness(
        tmp_path,
        request,
        "nccl_teardown",
        "--nproc",
        "2",
        "--mode",
        "full",
        "--builder",
        "torch",
        "--cycles",
        "1",
        "--backend",
        "gloo",
        "--report",
        str(report),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _no_torchrun_noise(proc)
    assert proc.stdout.startswith("gate nccl_teardown: PASSED (gloo, world 2")
    assert "all checks passed" in proc.stdout
    assert f"report: {report}" in proc.stdout and f"launch output: {tmp_path / 'out' / 't.log'}" in proc.stdout
    assert report.is_file() and (tmp_path / "out" / "t.events.jsonl").is_file()


def test_a_designed_failure_is_exit_1_with_its_headline(tmp_path, request):
    proc = _rlharness(
        tmp_path,
        request,
        "nccl_teardown",
        "--mode",
        "full",
        "--builder",
        "torch",
        "--cycles",
        "1",
        "--backend",
        "gloo",
        hook="leak_group",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    _no_torchrun_noise(proc)
    head, headline = proc.stdout.splitlines()[:2]
    assert head.startswith("gate nccl_teardown: FAILED") and "groups_released" in headline
    assert "report: runs/gates/nccl_teardown.json" in proc.stdout  # the default report path
    assert "ChildFailedError" in (tmp_path / "runs" / "gates" / "nccl_teardown.log").read_text()


@pytest.mark.skipif(
    torch.distributed.is_available() and torch.distributed.is_nccl_available(),
    reason="this torch has NCCL: --backend nccl would run, not skip",
)
def test_a_skip_is_exit_77(tmp_path, request):
    # one rank: the skip is decided before any collective (two would only start another torch)
    proc = _rlharness(
        tmp_path, request, "nccl_teardown", "--nproc", "1", "--backend", "nccl", "--report", str(tmp_path / "s.json")
    )
    assert proc.returncode == ExitCode.SKIPPED, proc.stdout + proc.stderr
    _no_torchrun_noise(proc)
    assert proc.stdout.startswith("gate nccl_teardown: SKIPPED") and "no NCCL" in proc.stdout


@pytest.mark.parametrize(
    "argv,says",
    [
        (
            ["gate", "nope"],
            "unknown gate 'nope'; known: cycle_trends, dataplane_writeback, dual_pipeline, nccl_teardown",
        ),
        (
            ["gate", "nccl_teardown", "--cycles", "0"],
            "gate nccl_teardown: argument --cycles: must be a positive integer",
        ),
        (["gate", "nccl_teardown", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["gate", "nccl_teardown", "--nproc", "0"], "--nproc: expected an integer 1..64"),
        (["gate", "refit_stream", "--report", "/proc/r.json"], "--report /proc/r.json: cannot write there"),
    ],
)
def test_usage_errors_are_one_line_and_launch_nothing(argv, says, capsys, monkeypatch):
    def no_launch(*a, **k):
        raise AssertionError("a usage error must be found before torchrun starts")

    monkeypatch.setattr(gate_cmd, "run_torchrun", no_launch)
    if "/proc" in argv[-1] and not os.path.isdir("/proc"):
        pytest.skip("no /proc here")
    run_error(argv, capsys, says)


def test_every_gate_file_is_offered():
    names = gate_cmd.gate_names()
    files = sorted(
        f[:-3]
        for f in os.listdir(REPO / "gpu_gates")
        if f.endswith(".py") and "SPEC = GateSpec(" in (REPO / "gpu_gates" / f).read_text()
    )
    assert names == files and "dual_pipeline" in names


@pytest.mark.parametrize("forked", [True, False], ids=["forked-agent", "no-fork-subprocess"])
def test_torchrun_forked_or_not_is_torchruns_own_command_line(forked, tmp_path, monkeypatch):
    # torchrun's own parser, reached both ways: where os.fork is missing the agent is a
    # subprocess `python -m torch.distributed.run`; its usage text and exit code must be
    # what the forked agent gives (torch's, not rlharness's)
    if not forked:
        monkeypatch.delattr(gate_cmd.os, "fork")
    out = tmp_path / "launch.log"
    with open(out, "wb") as log:
        code = gate_cmd.run_torchrun(["--nproc-per-node", "1"], log.fileno(), dict(os.environ))
    text = out.read_text()
    assert code == 2, text
    assert text.startswith("usage: ") and "--nproc-per-node" in text and "required: training_script" in text
