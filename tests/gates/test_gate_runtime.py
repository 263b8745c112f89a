"""Fast, in-process tests of the gate runtime's pieces (no torchrun)."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("torch")

from gpu_gates.runtime import report as rep  # noqa: E402
from gpu_gates.runtime.dist_setup import LaunchEnv, select_backend  # noqa: E402
from gpu_gates.runtime.hooks import HookSpecError, TestHooks, parse_hooks  # noqa: E402
from gpu_gates.runtime import gate as runtime  # noqa: E402
from gpu_gates.runtime.gate import AFTER_FAILURE_MARKER, primary_failure  # noqa: E402
from gpu_gates.selective_sync import targets_for  # noqa: E402
from harness.exit_codes import ExitCode  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def test_hook_parsing_and_rank_targeting():
    hooks = parse_hooks("hang@sync:2, corrupt_byte:3 ,leak_group")
    assert [h.name for h in hooks] == ["hang", "corrupt_byte", "leak_group"]
    assert hooks[0].point == "sync" and hooks[0].rank == 2 and hooks[1].arg == "3"
    assert TestHooks(hooks, rank=2, world_size=4).matching_point("sync") is hooks[0]
    assert TestHooks(hooks, rank=1, world_size=4).matching_point("sync") is None
    default_rank = TestHooks(parse_hooks("raise@x"), rank=3, world_size=4)
    assert default_rank.matching_point("x") is not None  # default target: the last rank


def test_a_delay_hook_gives_its_seconds_its_default_or_nothing():
    hooks = TestHooks(parse_hooks("late_start:0.5,late_skip_report"), rank=0, world_size=2)
    assert hooks.seconds("late_start", 0.2) == 0.5
    assert hooks.seconds("late_skip_report", 1.0) == 1.0
    assert hooks.seconds("late_usage_error", 1.0) == 0.0


@pytest.mark.parametrize(
    "bad",
    ["explode", "hang@", "hang@x:one", "corrupt@x", "late_receivers:soon", "late_receivers:-1", "late_usage_error:0"],
)
def test_bad_hooks_are_rejected(bad):
    with pytest.raises(HookSpecError):
        parse_hooks(bad)


def test_raise_hook_raises():
    hook = parse_hooks("raise@p:0")[0]
    with pytest.raises(RuntimeError, match="raise@p"):
        TestHooks.act(hook)


def test_primary_failure_prefers_root_cause_and_lists_timeouts():
    failures = ["rank 0: rank 0 terminated by SIGTERM (...)", "rank 3: bit_exact: cycle 0: 'w' differs"]
    assert primary_failure(failures).startswith("rank 3: bit_exact")
    timeouts = [
        "rank 1: rank 1 timed out: deadline passed while in phase 'a'",
        "rank 2: rank 2 timed out: deadline passed while in phase 'b'",
    ]
    message = primary_failure(timeouts)
    assert message.startswith("2 rank(s) timed out") and "'a'" in message and "'b'" in message


def test_a_leak_found_after_a_failure_does_not_take_the_headline():
    # rank 0 gave up because rank 2 hung: the group it shares with rank 2 cannot be torn
    # down, and rank 0's results come first; the headline is rank 2's timeout
    failures = [
        f"rank 0: no_group_survives: process group(s) alive at the end of the run: g ({AFTER_FAILURE_MARKER})",
        "rank 0: rank 0 GateAbort in phase 'serve': rank 2 timed out",
        "rank 2: rank 2 timed out: deadline passed while in phase 'sync_recv'",
    ]
    assert primary_failure(failures).startswith("rank 2: rank 2 timed out")
    # a leak after a run that completed is the headline
    leak = "rank 0: no_group_survives: process group(s) alive at the end of the run: g"
    assert primary_failure([leak, "rank 1: rank 1 terminated by SIGTERM"]) == leak


def test_with_only_knock_on_failures_a_silent_rank_heads_the_report_not_a_sigterm():
    # the hung rank exited at its deadline before its result reached rank 0; the launcher
    # then tore rank 0 down: the headline names the rank that never reported
    failures = [
        "rank 0: rank 0 terminated by SIGTERM (the launcher tore the job down)",
        "rank 2 never reported (hung, died, or blocked on a failed peer)",
    ]
    assert primary_failure(failures).startswith("rank 2 never reported")
    assert primary_failure(failures[:1]) == failures[0]


def test_atomic_write_and_paths(tmp_path):
    path = tmp_path / "sub" / "r.json"
    rep.atomic_write_json(str(path), {"status": "passed"})
    assert json.loads(path.read_text()) == {"status": "passed"}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]
    assert rep.rank_report_path(str(path), 2).endswith("r.rank2.json")
    assert rep.default_event_log_path(str(path)).endswith("r.events.jsonl")
    assert (
        rep.exit_code_for("passed") == 0
        and rep.exit_code_for("skipped") == ExitCode.SKIPPED
        and rep.exit_code_for("failed") == 1
    )


def test_summary_text_renders_tables():
    report = {
        "gate": "g",
        "status": "failed",
        "backend": "gloo",
        "world_size": 2,
        "elapsed_s": 1.0,
        "message": "boom",
        "ranks": [
            {
                "rank": 0,
                "status": "failed",
                "phase": "p",
                "checks": [{"name": "c", "passed": False}],
                "failures": ["c: x"],
            }
        ],
        "summary": {"modes": {"full": {"status": "failed", "verdict": "1 group survived"}}},
    }
    text = rep.summary_text(report)
    assert "gate g: FAILED" in text and "full: FAILED - 1 group survived" in text and "first failure" in text


def test_backend_selection_on_this_node():
    env = LaunchEnv(
        rank=0, world_size=2, local_rank=0, local_world_size=2, master_addr="127.0.0.1", master_port=1, agent_store=True
    )
    backend, skip = select_backend("gloo", env)
    assert (backend, skip) == ("gloo", None)
    import torch

    if not torch.cuda.is_available():
        assert select_backend("auto", env) == ("gloo", None)
        backend, skip = select_backend("nccl", env)
        assert backend is None and "nccl requested" in skip


def test_device_flag_is_a_skip_where_the_node_cannot_honour_it():
    import torch
    from gpu_gates.runtime.dist_setup import device_for, device_skip_reason

    env = LaunchEnv(
        rank=1, world_size=2, local_rank=1, local_world_size=2, master_addr="127.0.0.1", master_port=1, agent_store=True
    )
    assert device_skip_reason("nccl", "cpu") is not None  # NCCL keeps tensors on GPUs
    assert device_skip_reason("gloo", "cpu") is None and device_for("gloo", env, "cpu").type == "cpu"
    assert device_for("gloo", env, "auto").type == "cpu"  # CI's default stays on the host
    if not torch.cuda.is_available():
        assert "no device" in device_skip_reason("gloo", "cuda")


def test_targets_alternate():
    assert [targets_for(c, [2, 3]) for c in range(4)] == [[2, 3], [3], [2], [3]]


def test_bad_hook_env_is_a_usage_error_with_one_line():
    env = dict(os.environ, RLHARNESS_GATE_TEST_HOOK="explode", PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, str(REPO / "gpu_gates" / "selective_sync.py")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "unknown hook 'explode'" in proc.stderr


def _ended_then_signalled(code: int) -> None:
    """In a forked child: the main thread's finish is under way and ends the rank with
    ``code``, while an emergency finisher (SIGTERM) waits for it; leaves by ``os._exit``."""
    run = runtime._GateRun.__new__(runtime._GateRun)  # only what finishing needs
    run._finish_lock, run.ended = threading.Lock(), None
    run._finish_lock.acquire()  # the main thread's finish is under way ...
    threading.Timer(0.3, lambda: setattr(run, "ended", code)).start()  # ... and ends the rank
    run._enter_finish("terminated by SIGTERM")  # os._exit: the code says which way it left


@pytest.mark.parametrize("code", [0, 3])
def test_a_signal_after_the_rank_ended_leaves_with_its_code_at_once(code):
    # A passing rank that torch's agent runs as a function returns instead of exiting
    # (tests/gates/launch_forked.py); the agent may still SIGTERM it while it waits to be
    # collected. The emergency finisher must then leave with the code the rank ended
    # with, at once, not wait out its 10 s and leave failed (exit 1: a pass turned into a failure).
    # A fork of this process: a new interpreter would only import torch again.
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child leaves with os._exit
        try:
            _ended_then_signalled(code)
        finally:
            os._exit(99)  # _enter_finish returned or raised: neither may happen
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == code


def _write_blocks(fd_w: int, writer: int, blocks: int) -> None:
    stream = os.fdopen(fd_w, "w")
    for b in range(blocks):
        runtime.write_at_once(stream, "".join(f"w{writer} b{b} line {i}\n" for i in range(30)))
    os._exit(0)


def test_concurrent_multi_line_messages_are_never_cut_by_each_other():
    # four processes on one pipe, as the ranks on the launcher's stderr: every 30-line block
    # must arrive whole (printed line by line, blocks of different writers interleave)
    r, w = os.pipe()
    pids = []
    for writer in range(4):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child leaves with os._exit
            os.close(r)
            _write_blocks(w, writer, 200)
        pids.append(pid)
    os.close(w)
    with os.fdopen(r) as pipe:
        lines = pipe.read().splitlines()
    for pid in pids:
        assert os.waitpid(pid, 0)[1] == 0
    assert len(lines) == 4 * 200 * 30
    for start in range(0, len(lines), 30):
        writer, block = lines[start].split()[:2]
        assert lines[start : start + 30] == [f"{writer} {block} line {i}" for i in range(30)], start


def test_a_stream_without_descriptor_gets_an_ordinary_write():
    import io

    buffer = io.StringIO()
    runtime.write_at_once(buffer, "a\nb\n")
    assert buffer.getvalue() == "a\nb\n"


def test_a_failure_headline_on_a_closed_stderr_does_not_stop_the_rank(monkeypatch):
    # the abort is posted and the report written after the headline: a stderr that is gone
    # (closed pipe, closed descriptor) must not raise out of the failure path
    r, w = os.pipe()
    stream = os.fdopen(w, "w")
    os.close(r)  # nobody reads: write(2) fails with EPIPE (Python ignores SIGPIPE)
    monkeypatch.setattr(sys, "stderr", stream)
    run = runtime._GateRun.__new__(runtime._GateRun)
    run.env = LaunchEnv(
        rank=1, world_size=2, local_rank=1, local_world_size=2, master_addr="127.0.0.1", master_port=1, agent_store=True
    )
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        run._print_failure(exc, "rank 1 RuntimeError in phase 'x': boom")
    with pytest.raises(OSError):
        runtime.write_at_once(stream, "still gone\n")


def test_a_growth_check_on_a_shared_gpu_reads_the_process_own_memory():
    from gpu_gates.runtime.memory import own_device_bytes

    sample = {"used": 2_000, "reserved": 300, "process_used": 500}
    assert own_device_bytes(sample, shared=False) == (2_000, "device memory")
    assert own_device_bytes(sample, shared=True)[0] == 500  # NVML's count of this process
    assert own_device_bytes({"used": 2_000, "reserved": 300, "process_used": None}, shared=True)[0] == 300
